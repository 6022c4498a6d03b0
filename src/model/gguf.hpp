// Reading GGUF model files (ggml's format: metadata key/values, tensor descriptors, aligned data),
// read into memory, with every offset, size and type validated before use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "model/ggml_types.hpp"

namespace gaac::model {

/// GGUF metadata value-type ids (as stored in the file).
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};
/// Name of a value-type id ("u32", "string", "array"); "unknown" for other ids.
const char* value_type_name(uint32_t id);

/// One tensor: `ne[0]` is the contiguous dimension (a weight [ne0 = in, ne1 = out] holds `out` rows
/// of `in` values). `bytes` points into the file's bytes (held in memory) and lives as long as the GgufFile.
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::f32;
  std::vector<int64_t> ne;
  std::span<const uint8_t> bytes;
  /// Offset of the tensor's data from the start of the data section, as stored in the file.
  uint64_t offset = 0;

  /// Product of ne (1 for a tensor of no dimensions; never overflows for a parsed tensor).
  int64_t elements() const;
  /// Elements per row (ne[0]; 1 for a tensor of no dimensions).
  int64_t row_elements() const { return ne.empty() ? 1 : ne[0]; }
  /// Rows (elements / ne[0]; 0 when ne[0] is 0).
  int64_t rows() const;
  /// Bytes per row (rows() * row_bytes() == bytes.size() for a parsed tensor).
  size_t row_bytes() const;
};

/// A GGUF metadata value: unsigned integers as uint64_t, signed ones as int64_t, f32 and f64 as double,
/// bools, strings, or arrays (of any of these, arrays included). GgufFile::value_type() gives the
/// type as stored.
struct GgufArray;
using GgufValue = std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<const GgufArray>>;
/// An array value; `type` is the GGUF value-type id of its elements.
struct GgufArray {
  uint32_t type;
  std::vector<GgufValue> items;
};

/// An open GGUF file (version 2 or 3, little-endian). Construction validates the whole header and
/// every tensor's type, shape, alignment and byte range (inside the data section, no two overlapping);
/// malformed files throw gaac::Error naming the file, the key or tensor, and what is wrong; nothing
/// outside the file is ever read. Parsed metadata takes memory proportional to the header's size.
class GgufFile {
 public:
  /// Reads `path` into memory (io::FileBytes) and validates it.
  static GgufFile open(const std::string& path);
  /// Validates an in-memory image (copied), for tests and fuzzing.
  static GgufFile parse(std::span<const uint8_t> image, const std::string& label);

  /// GGUF version (2 or 3).
  uint32_t version() const;
  /// Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const;
  /// The value of `key`, or nullptr.
  const GgufValue* find(const std::string& key) const;
  /// The value-type id of `key` as stored (GgufType), or -1 when the key is missing.
  int64_t value_type(const std::string& key) const;
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
  /// Alignment of tensor data (general.alignment, 32 by default).
  uint64_t alignment() const;
  /// File offset of the data section (the end of the header, rounded up to the alignment).
  uint64_t data_offset() const;

 private:
  struct State;
  /// The parsed file; an empty one (no metadata, no tensors) for a default-constructed GgufFile.
  const State& state() const;
  std::shared_ptr<const State> state_;
};

}  // namespace gaac::model
