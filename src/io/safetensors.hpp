// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw tensor bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

namespace gaac::io {

/// Element types of the safetensors format that gaac reads or writes.
enum class Dtype : uint8_t { bool_, u8, i8, u16, i16, u32, i32, u64, i64, f16, bf16, f32, f64, f8_e4m3, f8_e5m2, other };

/// The header spelling of a dtype ("BF16", "U8", ...); "other" for unknown ones.
const char* dtype_name(Dtype dtype);
/// Bytes per element (0 for Dtype::other).
size_t dtype_size(Dtype dtype);
/// Parses a header spelling; unknown spellings give Dtype::other (the raw spelling stays in the view).
Dtype parse_dtype(const std::string& name);

/// One tensor of an open file. `bytes` points into the file's bytes (held in memory) and lives as long as it.
struct TensorView {
  std::string name;
  Dtype dtype = Dtype::other;
  std::string dtype_spelling;  ///< as written in the header, for messages about unsupported types
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;

  /// Product of the shape (1 for a scalar).
  int64_t elements() const;
};

/// A safetensors file opened read-only. Every offset, size, shape and dtype is validated on open:
/// a truncated, overlapping or otherwise malformed file throws gaac::Error naming the file and the
/// offending tensor, and nothing is read outside the file.
class SafetensorsFile {
 public:
  /// Reads `path` into memory (io::FileBytes) and validates it.
  static SafetensorsFile open(const std::string& path);
  /// Validates an in-memory image (copied); `label` names it in error messages.
  static SafetensorsFile parse(std::span<const uint8_t> image, const std::string& label);

  /// Tensors in the order of their data offsets.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const TensorView* find(const std::string& name) const;
  /// The `__metadata__` string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The path or label given when opening.
  const std::string& label() const { return label_; }

 private:
  struct Storage;
  std::shared_ptr<const Storage> storage_;
  std::string label_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Collects tensors and metadata, then writes them as one safetensors file. Tensor data is copied
/// when added, so the caller's buffers may go away.
class SafetensorsWriter {
 public:
  /// Adds a tensor; `bytes.size()` must equal the shape's element count times the dtype size.
  void add(const std::string& name, Dtype dtype, std::vector<int64_t> shape, std::span<const uint8_t> bytes);
  /// Sets one `__metadata__` entry.
  void set_metadata(const std::string& key, const std::string& value);
  /// Writes the file through write_output() (atomically for a regular file, never over one of
  /// `inputs`). Throws gaac::Error on failure: a name or metadata string that is not UTF-8, or I/O.
  void write(const std::string& path, std::span<const std::string> inputs = {}) const;
  /// The complete file image, for tests and in-memory use.
  std::vector<uint8_t> image() const;

 private:
  struct Entry {
    std::string name;
    Dtype dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<Entry> entries_;
  std::unordered_set<std::string> names_;  ///< of entries_, so adding n tensors costs O(n)
  std::map<std::string, std::string> metadata_;
};

}  // namespace gaac::io
