// Reading GGUF model files (ggml's format: metadata key/values, tensor descriptors, aligned data),
// memory-mapped, with every offset, size and type validated before use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace gaac::model {

/// ggml tensor types gaac knows (ids as in ggml).
enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8,
  q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30,
};

/// Name of a type ("Q4_K"); "unknown" for ids gaac does not know.
const char* type_name(GgmlType type);
/// Elements per quantization block (1 for plain float types); 0 for unknown ids.
int64_t block_elements(GgmlType type);
/// Bytes per block; 0 for unknown ids.
size_t block_bytes(GgmlType type);
/// True when the id is one of GgmlType's values.
bool known_type(uint32_t id);

/// One tensor: `ne[0]` is the contiguous dimension (a weight [ne0 = in, ne1 = out] holds `out` rows
/// of `in` values). `bytes` points into the file's mapping and lives as long as the GgufFile.
struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::span<const uint8_t> bytes;

  /// Product of ne.
  int64_t elements() const;
  /// Elements per row (ne[0]).
  int64_t row_elements() const { return ne.empty() ? 1 : ne[0]; }
  /// Rows (elements / ne[0]).
  int64_t rows() const;
  /// Bytes per row.
  size_t row_bytes() const;
};

/// A GGUF metadata value: scalars widened to 64 bits, strings, or arrays of either.
struct GgufArray;
using GgufValue = std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<const GgufArray>>;
/// An array value; `type` is the GGUF value-type id of its elements.
struct GgufArray {
  uint32_t type;
  std::vector<GgufValue> items;
};

/// An open GGUF file. Construction validates the whole header; malformed files throw gaac::Error
/// naming the file and what is wrong; nothing outside the file is ever read.
class GgufFile {
 public:
  /// Memory-maps and validates `path`.
  static GgufFile open(const std::string& path);
  /// Validates an in-memory image (copied), for tests and fuzzing.
  static GgufFile parse(std::span<const uint8_t> image, const std::string& label);

  /// GGUF version (2 or 3).
  uint32_t version() const;
  /// Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const;
  /// The value of `key`, or nullptr.
  const GgufValue* find(const std::string& key) const;
  /// Typed getters: throw gaac::Error naming the key when it is missing or of another type.
  /// Integer getters accept any integer type whose value fits.
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_strings(const std::string& key) const;
  std::vector<float> get_floats(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key) const;

  /// Tensors in file order.
  const std::vector<GgufTensor>& tensors() const;
  /// The tensor called `name`, or nullptr.
  const GgufTensor* tensor(const std::string& name) const;
  /// The path or label given when opening.
  const std::string& label() const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

}  // namespace gaac::model
