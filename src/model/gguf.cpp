// GGUF reading. The reader trusts nothing in the file: every count is checked against the bytes that
// remain before anything is allocated for it, every read is bounds-checked, and every tensor's type,
// shape, alignment and byte range is validated before its bytes are exposed. Every failure is a
// gaac::Error naming the file and the key or tensor concerned.
#include "model/gguf.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "gaac/error.hpp"
#include "io/files.hpp"

namespace gaac::model {
namespace {

/// "GGUF" as the first four bytes of the file.
constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
/// Magic, version, tensor count, metadata count.
constexpr uint64_t kFixedHeaderBytes = 4 + 4 + 8 + 8;
constexpr uint64_t kDefaultAlignment = 32;
constexpr const char* kAlignmentKey = "general.alignment";
/// ggml's GGML_MAX_DIMS.
constexpr uint32_t kMaxDims = 4;
/// Arrays may hold arrays, but no deeper than this (an array of arrays is 2 levels). Bounds the
/// recursion of the parser whatever the file says.
constexpr int kMaxArrayDepth = 8;
/// Fewest bytes a metadata entry can take: key length, value type and a 1-byte value.
constexpr uint64_t kMinEntryBytes = 8 + 4 + 1;
/// Fewest bytes a tensor descriptor can take: name length, n_dims, type and offset.
constexpr uint64_t kMinDescriptorBytes = 8 + 4 + 4 + 8;
constexpr uint64_t kMaxInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

/// One GGUF value type: its name and the fewest bytes a value of it takes in the file (the exact
/// size for scalars; the length prefix for strings; element type and count for arrays).
struct ValueTypeInfo {
  const char* name;
  uint64_t min_bytes;
};

/// Indexed by value-type id.
constexpr ValueTypeInfo kValueTypes[] = {
    {"u8", 1},     {"i8", 1},     {"u16", 2},  {"i16", 2},  {"u32", 4},  {"i32", 4},  {"f32", 4},
    {"bool", 1},   {"string", 8}, {"array", 12}, {"u64", 8}, {"i64", 8}, {"f64", 8},
};
constexpr uint32_t kValueTypeCount = sizeof(kValueTypes) / sizeof(kValueTypes[0]);

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

/// "[576, 49152]" for messages.
std::string shape_text(const std::vector<int64_t>& ne) {
  std::string text = "[";
  for (size_t i = 0; i < ne.size(); ++i) text += (i ? ", " : "") + std::to_string(ne[i]);
  return text + "]";
}

/// Throws an error about the file as a whole: "<label>: <message>".
[[noreturn]] void fail_file(const std::string& label, const std::string& message,
                            SourceLocation loc = SourceLocation()) {
  throw Error(label + ": " + message, loc);
}

/// Throws an error about one metadata key: "<label>: key '<key>': <message>".
[[noreturn]] void fail_key(const std::string& label, const std::string& key, const std::string& message,
                           SourceLocation loc = SourceLocation()) {
  throw Error(label + ": key " + in_quotes(key) + ": " + message, loc);
}

/// Throws an error about one tensor: "<label>: tensor '<name>': <message>".
[[noreturn]] void fail_tensor(const std::string& label, const std::string& name, const std::string& message,
                              SourceLocation loc = SourceLocation()) {
  throw Error(label + ": tensor " + in_quotes(name) + ": " + message, loc);
}

// ---------------------------------------------------------------------------------------------
// Reading the header

/// Sequential little-endian reads from the image, each checked against the bytes that remain.
/// Failures name the file and what was being read (set_context()).
class Reader {
 public:
  Reader(std::span<const uint8_t> image, const std::string& label) : image_(image), label_(label) {}

  uint64_t offset() const { return pos_; }
  uint64_t remaining() const { return image_.size() - pos_; }
  uint64_t size() const { return image_.size(); }

  /// What is being read, for messages ("key 'general.name'"); empty for the file header.
  void set_context(std::string context) { context_ = std::move(context); }

  [[noreturn]] void fail(const std::string& message, SourceLocation loc = SourceLocation()) const {
    throw Error(label_ + ": " + (context_.empty() ? "" : context_ + ": ") + message, loc);
  }

  /// Consumes `n` bytes and returns where they start.
  const uint8_t* take(uint64_t n, const char* what) {
    if (n > remaining()) {
      fail(std::string("truncated: the ") + what + " needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + " but the " + std::to_string(image_.size()) + "-byte file has " +
           std::to_string(remaining()) + " left");
    }
    const uint8_t* p = image_.data() + pos_;
    pos_ += n;
    return p;
  }

  /// An unsigned little-endian integer of `n` (1, 2, 4 or 8) bytes.
  uint64_t unsigned_le(uint64_t n, const char* what) {
    const uint8_t* p = take(n, what);
    uint64_t v = 0;
    for (uint64_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
  }
  /// A two's-complement little-endian integer of `n` bytes, sign-extended.
  int64_t signed_le(uint64_t n, const char* what) {
    const uint64_t v = unsigned_le(n, what);
    const unsigned shift = static_cast<unsigned>(64 - 8 * n);
    return static_cast<int64_t>(v << shift) >> shift;  // arithmetic shift (C++20)
  }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(unsigned_le(4, what)); }
  uint64_t u64(const char* what) { return unsigned_le(8, what); }

  /// A GGUF string: u64 length, then that many bytes (no terminator).
  std::string string(const char* what) {
    const uint64_t length = u64(what);
    if (length > remaining()) {
      fail(std::string("the ") + what + "'s length " + std::to_string(length) + " runs past the end of the file (" +
           std::to_string(remaining()) + " bytes left at offset " + std::to_string(pos_) + ")");
    }
    const auto* p = reinterpret_cast<const char*>(take(length, what));
    return std::string(p, static_cast<size_t>(length));
  }

 private:
  std::span<const uint8_t> image_;
  const std::string& label_;
  std::string context_;
  uint64_t pos_ = 0;
};

/// Reads one value of type `type` nested in `depth` arrays.
GgufValue read_value(Reader& r, uint32_t type, int depth) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::u8: return r.unsigned_le(1, "u8 value");
    case GgufType::u16: return r.unsigned_le(2, "u16 value");
    case GgufType::u32: return r.unsigned_le(4, "u32 value");
    case GgufType::u64: return r.unsigned_le(8, "u64 value");
    case GgufType::i8: return r.signed_le(1, "i8 value");
    case GgufType::i16: return r.signed_le(2, "i16 value");
    case GgufType::i32: return r.signed_le(4, "i32 value");
    case GgufType::i64: return r.signed_le(8, "i64 value");
    case GgufType::f32: {
      const auto bits = static_cast<uint32_t>(r.unsigned_le(4, "f32 value"));
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return static_cast<double>(f);
    }
    case GgufType::f64: {
      const uint64_t bits = r.unsigned_le(8, "f64 value");
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return d;
    }
    case GgufType::boolean: {
      const uint64_t b = r.unsigned_le(1, "bool value");
      if (b > 1) r.fail("bool value " + std::to_string(b) + " is neither 0 nor 1");
      return b == 1;
    }
    case GgufType::string: return r.string("string value");
    case GgufType::array: {
      const uint32_t item_type = r.u32("array element type");
      if (item_type >= kValueTypeCount) r.fail("array of unknown value type id " + std::to_string(item_type));
      const uint64_t count = r.u64("array length");
      if (item_type == static_cast<uint32_t>(GgufType::array) && depth + 1 >= kMaxArrayDepth) {
        r.fail("arrays nest deeper than " + std::to_string(kMaxArrayDepth) + " levels");
      }
      // Checked before reserving, so that a hostile count cannot claim memory the file cannot back.
      const uint64_t min_bytes = kValueTypes[item_type].min_bytes;
      if (count > r.remaining() / min_bytes) {
        r.fail("array of " + std::to_string(count) + " " + kValueTypes[item_type].name + " items cannot fit in the " +
               std::to_string(r.remaining()) + " bytes left at offset " + std::to_string(r.offset()));
      }
      auto array = std::make_shared<GgufArray>();
      array->type = item_type;
      array->items.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i) array->items.push_back(read_value(r, item_type, depth + 1));
      return std::shared_ptr<const GgufArray>(std::move(array));
    }
  }
  r.fail("unknown value type id " + std::to_string(type));
}

/// "u32", "string", "array of f32" for messages about a key's type.
std::string describe_type(uint32_t type, const GgufValue& value) {
  std::string text = value_type_name(type);
  if (const auto* a = std::get_if<std::shared_ptr<const GgufArray>>(&value)) {
    text += std::string(" of ") + value_type_name((*a)->type);
  }
  return text;
}

/// The value as uint64 if it is an integer that fits.
std::optional<uint64_t> as_uint(const GgufValue& value) {
  if (const auto* u = std::get_if<uint64_t>(&value)) return *u;
  if (const auto* i = std::get_if<int64_t>(&value); i && *i >= 0) return static_cast<uint64_t>(*i);
  return std::nullopt;
}

/// The value as int64 if it is an integer that fits.
std::optional<int64_t> as_int(const GgufValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&value); u && *u <= kMaxInt64) return static_cast<int64_t>(*u);
  return std::nullopt;
}

bool is_integer(const GgufValue& value) {
  return std::holds_alternative<uint64_t>(value) || std::holds_alternative<int64_t>(value);
}

/// "-5" or "18446744073709551615" for messages about integers that do not fit.
std::string integer_text(const GgufValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* u = std::get_if<uint64_t>(&value)) return std::to_string(*u);
  return "?";
}

/// A tensor descriptor as read, before its byte range is resolved against the data section.
struct TensorDescriptor {
  GgufTensor tensor;
  uint64_t nbytes = 0;
};

/// Everything a valid header describes, with tensor views into the image.
struct ParsedImage {
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata;
  std::vector<uint32_t> value_types;  ///< parallel to metadata
  std::unordered_map<std::string, size_t> key_index;
  std::vector<GgufTensor> tensors;
  std::unordered_map<std::string, size_t> tensor_index;
};

/// Magic and version; returns the version.
uint32_t read_preamble(Reader& r, std::span<const uint8_t> image, const std::string& label) {
  if (image.size() < kFixedHeaderBytes) {
    // Still say "not GGUF" when the few bytes there are show it.
    if (image.size() >= 4 && std::memcmp(image.data(), kMagic, 4) != 0) {
      fail_file(label, "not a GGUF file (it does not start with \"GGUF\")");
    }
    fail_file(label, "file of " + std::to_string(image.size()) + " bytes is too short for a GGUF header (" +
                         std::to_string(kFixedHeaderBytes) + " bytes)");
  }
  const uint8_t* magic = r.take(4, "magic");
  if (std::memcmp(magic, kMagic, 4) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%02x %02x %02x %02x", magic[0], magic[1], magic[2], magic[3]);
    fail_file(label, std::string("not a GGUF file (magic bytes ") + hex + ", expected 47 47 55 46 \"GGUF\")");
  }
  const uint32_t version = r.u32("version");
  if (version == 1) fail_file(label, "GGUF version 1 is not supported (only versions 2 and 3)");
  if (version == 0x02000000u || version == 0x03000000u) {
    fail_file(label, "big-endian GGUF files are not supported (version field reads " + std::to_string(version) +
                         " little-endian)");
  }
  if (version != 2 && version != 3) {
    fail_file(label, "unsupported GGUF version " + std::to_string(version) + " (only versions 2 and 3)");
  }
  return version;
}

/// The metadata entries, checked for duplicate or empty keys and known value types.
void read_metadata(Reader& r, uint64_t count, const std::string& label, ParsedImage& parsed) {
  parsed.metadata.reserve(static_cast<size_t>(count));
  parsed.value_types.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    r.set_context("metadata entry " + std::to_string(i));
    std::string key = r.string("key");
    if (key.empty()) r.fail("empty key");
    if (parsed.key_index.count(key) != 0) fail_key(label, key, "appears twice in the metadata");
    r.set_context("key " + in_quotes(key));
    const uint32_t type = r.u32("value type");
    if (type >= kValueTypeCount) r.fail("unknown value type id " + std::to_string(type));
    GgufValue value = read_value(r, type, 0);
    parsed.key_index.emplace(key, parsed.metadata.size());
    parsed.metadata.emplace_back(std::move(key), std::move(value));
    parsed.value_types.push_back(type);
  }
  r.set_context("");
}

/// general.alignment, validated: an integer, a power of two (32 when absent).
uint64_t alignment_of(const ParsedImage& parsed, const std::string& label) {
  const auto it = parsed.key_index.find(kAlignmentKey);
  if (it == parsed.key_index.end()) return kDefaultAlignment;
  const GgufValue& value = parsed.metadata[it->second].second;
  if (!is_integer(value)) {
    fail_key(label, kAlignmentKey, std::string("must be an integer, not ") +
                                       describe_type(parsed.value_types[it->second], value));
  }
  const auto alignment = as_uint(value);
  if (!alignment || *alignment == 0 || (*alignment & (*alignment - 1)) != 0) {
    fail_key(label, kAlignmentKey, "alignment " + integer_text(value) + " is not a power of two");
  }
  return *alignment;
}

/// One tensor descriptor, validated on its own (name, shape, type, size, offset alignment).
TensorDescriptor read_descriptor(Reader& r, uint64_t index, uint64_t alignment, const std::string& label,
                           const ParsedImage& parsed) {
  r.set_context("tensor descriptor " + std::to_string(index));
  TensorDescriptor d;
  GgufTensor& t = d.tensor;
  t.name = r.string("tensor name");
  if (t.name.empty()) r.fail("empty tensor name");
  if (parsed.tensor_index.count(t.name) != 0) fail_tensor(label, t.name, "appears twice among the tensors");
  r.set_context("tensor " + in_quotes(t.name));
  const uint32_t n_dims = r.u32("dimension count");
  if (n_dims > kMaxDims) {
    r.fail("n_dims " + std::to_string(n_dims) + " exceeds the maximum of " + std::to_string(kMaxDims));
  }
  // The running product is checked at every step (even when a later dimension is 0), so that
  // GgufTensor::elements() never overflows.
  uint64_t elements = 1;
  for (uint32_t i = 0; i < n_dims; ++i) {
    const uint64_t n = r.u64("dimension");
    if (n > kMaxInt64) r.fail("dimension " + std::to_string(i) + " is " + std::to_string(n) + ", beyond int64");
    t.ne.push_back(static_cast<int64_t>(n));
    if (__builtin_mul_overflow(elements, n, &elements) || elements > kMaxInt64) {
      r.fail("element count overflows at dimension " + std::to_string(i) + " (shape so far " + shape_text(t.ne) + ")");
    }
  }
  const uint32_t type_id = r.u32("ggml type");
  t.type = static_cast<GgmlType>(type_id);
  if (!supported_type(t.type)) r.fail("unknown ggml type id " + std::to_string(type_id));
  const GgmlTypeInfo& info = ggml_type_info(t.type);
  t.offset = r.u64("data offset");
  if (t.row_elements() % info.block_elements != 0) {
    r.fail("rows of " + std::to_string(t.row_elements()) + " elements (shape " + shape_text(t.ne) +
           ") are not a multiple of the " + info.name + " block of " + std::to_string(info.block_elements));
  }
  // elements is a whole number of blocks since ne[0] is; a row is never larger than the whole
  // unless the tensor is empty, so both sizes are checked.
  const auto blocks = elements / static_cast<uint64_t>(info.block_elements);
  const auto row_blocks = static_cast<uint64_t>(t.row_elements() / info.block_elements);
  uint64_t row_bytes = 0;
  if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(info.block_bytes), &d.nbytes) ||
      __builtin_mul_overflow(row_blocks, static_cast<uint64_t>(info.block_bytes), &row_bytes) ||
      d.nbytes > kMaxInt64 || row_bytes > kMaxInt64) {
    r.fail("byte size of shape " + shape_text(t.ne) + " of " + info.name + " overflows");
  }
  if (t.offset % alignment != 0) {
    r.fail("data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
           std::to_string(alignment));
  }
  return d;
}

/// Resolves every tensor's byte range inside the data section, then rejects overlaps.
void place_tensors(std::vector<TensorDescriptor>& descriptors, std::span<const uint8_t> image, uint64_t data_offset,
                   const std::string& label) {
  const uint64_t size = image.size();
  const uint64_t data_size = size > data_offset ? size - data_offset : 0;
  const uint64_t data_begin = std::min(data_offset, size);
  for (TensorDescriptor& d : descriptors) {
    GgufTensor& t = d.tensor;
    if (t.offset > data_size || d.nbytes > data_size - t.offset) {
      fail_tensor(label, t.name,
                  std::to_string(d.nbytes) + " bytes of " + ggml_type_info(t.type).name + " data at offset " +
                      std::to_string(t.offset) + " run past the end of the " + std::to_string(data_size) +
                      "-byte data section (file offset " + std::to_string(data_offset) + ", file of " +
                      std::to_string(size) + " bytes; truncated?)");
    }
    t.bytes = image.subspan(static_cast<size_t>(data_begin + t.offset), static_cast<size_t>(d.nbytes));
  }
  std::vector<size_t> order(descriptors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tuple(descriptors[a].tensor.offset, descriptors[a].nbytes, a) <
           std::tuple(descriptors[b].tensor.offset, descriptors[b].nbytes, b);
  });
  uint64_t covered_to = 0;
  const GgufTensor* covering = nullptr;
  for (const size_t i : order) {
    const TensorDescriptor& d = descriptors[i];
    if (d.nbytes == 0) continue;  // an empty tensor owns no bytes, so it cannot overlap
    if (covering != nullptr && d.tensor.offset < covered_to) {
      fail_tensor(label, d.tensor.name, "data overlaps tensor " + in_quotes(covering->name));
    }
    covered_to = d.tensor.offset + d.nbytes;
    covering = &d.tensor;
  }
}

/// Validates a whole image.
ParsedImage parse_image(std::span<const uint8_t> image, const std::string& label) {
  Reader r(image, label);
  ParsedImage parsed;
  parsed.version = read_preamble(r, image, label);
  const uint64_t n_tensors = r.u64("tensor count");
  const uint64_t n_kv = r.u64("metadata count");
  // Counts are checked against the file before anything is reserved for them.
  if (n_kv > r.remaining() / kMinEntryBytes) {
    fail_file(label, "metadata count " + std::to_string(n_kv) + " cannot fit in the " + std::to_string(r.size()) +
                         "-byte file");
  }
  if (n_tensors > (r.remaining() - n_kv * kMinEntryBytes) / kMinDescriptorBytes) {
    fail_file(label, "tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                         std::to_string(r.size()) + "-byte file besides " + std::to_string(n_kv) +
                         " metadata entries");
  }
  read_metadata(r, n_kv, label, parsed);
  parsed.alignment = alignment_of(parsed, label);

  std::vector<TensorDescriptor> descriptors;
  descriptors.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    descriptors.push_back(read_descriptor(r, i, parsed.alignment, label, parsed));
    parsed.tensor_index.emplace(descriptors.back().tensor.name, i);
  }
  // The data section starts at the end of the header rounded up to the alignment (no overflow:
  // the offset is below the file size and the padding below the alignment, both < 2^63).
  const uint64_t end = r.offset();
  parsed.data_offset = end + (parsed.alignment - end % parsed.alignment) % parsed.alignment;
  place_tensors(descriptors, image, parsed.data_offset, label);
  parsed.tensors.reserve(descriptors.size());
  for (TensorDescriptor& d : descriptors) parsed.tensors.push_back(std::move(d.tensor));
  return parsed;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Value types and tensors

const char* value_type_name(uint32_t id) { return id < kValueTypeCount ? kValueTypes[id].name : "unknown"; }

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (const int64_t d : ne) n *= d;
  return n;
}

int64_t GgufTensor::rows() const {
  const int64_t row = row_elements();
  return row == 0 ? 0 : elements() / row;
}

size_t GgufTensor::row_bytes() const {
  const GgmlTypeInfo& info = ggml_type_info(type);
  return info.block_elements == 0 ? 0 : static_cast<size_t>(row_elements() / info.block_elements) * info.block_bytes;
}

// ---------------------------------------------------------------------------------------------
// GgufFile

/// The bytes of an open file (read into memory, or a copy) and everything parsed from them.
struct GgufFile::State {
  io::FileBytes file;
  std::string label;
  ParsedImage parsed;

  std::span<const uint8_t> bytes() const { return file.bytes(); }

  /// Validates the stored image and wraps it as a file. (A member so that it may fill the file's
  /// private fields.)
  static GgufFile into_file(std::unique_ptr<State> state, const std::string& label) {
    state->label = label;
    state->parsed = parse_image(state->bytes(), label);
    GgufFile file;
    file.state_ = std::move(state);
    return file;
  }

  /// The value of `key`; throws naming the key when it is missing.
  const GgufValue& require(const std::string& key) const {
    const auto it = parsed.key_index.find(key);
    if (it == parsed.key_index.end()) fail_key(label, key, "missing");
    return parsed.metadata[it->second].second;
  }

  /// Throws "key '<key>' is <its type>, not <wanted>".
  [[noreturn]] void fail_type(const std::string& key, const char* wanted,
                              SourceLocation loc = SourceLocation()) const {
    const size_t i = parsed.key_index.at(key);
    fail_key(label, key, "is " + describe_type(parsed.value_types[i], parsed.metadata[i].second) + ", not " + wanted,
             loc);
  }

  /// The items of the array at `key`; throws when it is not an array.
  const std::vector<GgufValue>& require_array(const std::string& key, const char* wanted) const {
    const auto* a = std::get_if<std::shared_ptr<const GgufArray>>(&require(key));
    if (a == nullptr) fail_type(key, wanted);
    return (*a)->items;
  }
};

GgufFile GgufFile::open(const std::string& path) {
  auto state = std::make_unique<State>();
  state->file = io::FileBytes::open(path);
  return State::into_file(std::move(state), path);
}

GgufFile GgufFile::parse(std::span<const uint8_t> image, const std::string& label) {
  auto state = std::make_unique<State>();
  state->file = io::FileBytes::copy_of(image);
  return State::into_file(std::move(state), label);
}

const GgufFile::State& GgufFile::state() const {
  static const State empty;
  return state_ ? *state_ : empty;
}

uint32_t GgufFile::version() const { return state().parsed.version; }

const std::vector<std::pair<std::string, GgufValue>>& GgufFile::metadata() const { return state().parsed.metadata; }

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = state().parsed.key_index.find(key);
  return it == state().parsed.key_index.end() ? nullptr : &state().parsed.metadata[it->second].second;
}

int64_t GgufFile::value_type(const std::string& key) const {
  const auto it = state().parsed.key_index.find(key);
  if (it == state().parsed.key_index.end()) return -1;
  return static_cast<int64_t>(state().parsed.value_types[it->second]);
}

std::string GgufFile::get_string(const std::string& key) const {
  const auto* s = std::get_if<std::string>(&state().require(key));
  if (s == nullptr) state().fail_type(key, "a string");
  return *s;
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& value = state().require(key);
  if (!is_integer(value)) state().fail_type(key, "an integer");
  const auto u = as_uint(value);
  if (!u) fail_key(state().label, key, "value " + integer_text(value) + " is negative");
  return *u;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& value = state().require(key);
  if (!is_integer(value)) state().fail_type(key, "an integer");
  const auto i = as_int(value);
  if (!i) fail_key(state().label, key, "value " + integer_text(value) + " does not fit in int64");
  return *i;
}

double GgufFile::get_float(const std::string& key) const {
  const auto* d = std::get_if<double>(&state().require(key));
  if (d == nullptr) state().fail_type(key, "a float");
  return *d;
}

bool GgufFile::get_bool(const std::string& key) const {
  const auto* b = std::get_if<bool>(&state().require(key));
  if (b == nullptr) state().fail_type(key, "a bool");
  return *b;
}

std::vector<std::string> GgufFile::get_strings(const std::string& key) const {
  const auto& items = state().require_array(key, "an array of strings");
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const GgufValue& item : items) {
    const auto* s = std::get_if<std::string>(&item);
    if (s == nullptr) state().fail_type(key, "an array of strings");
    out.push_back(*s);
  }
  return out;
}

std::vector<float> GgufFile::get_floats(const std::string& key) const {
  const auto& items = state().require_array(key, "an array of floats");
  std::vector<float> out;
  out.reserve(items.size());
  for (const GgufValue& item : items) {
    const auto* d = std::get_if<double>(&item);
    if (d == nullptr) state().fail_type(key, "an array of floats");
    out.push_back(static_cast<float>(*d));
  }
  return out;
}

std::vector<int64_t> GgufFile::get_ints(const std::string& key) const {
  const auto& items = state().require_array(key, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!is_integer(items[i])) state().fail_type(key, "an array of integers");
    const auto v = as_int(items[i]);
    if (!v) {
      fail_key(state().label, key, "item " + std::to_string(i) + " (" + integer_text(items[i]) +
                                       ") does not fit in int64");
    }
    out.push_back(*v);
  }
  return out;
}

const std::vector<GgufTensor>& GgufFile::tensors() const { return state().parsed.tensors; }

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  const auto it = state().parsed.tensor_index.find(name);
  return it == state().parsed.tensor_index.end() ? nullptr : &state().parsed.tensors[it->second];
}

const std::string& GgufFile::label() const { return state().label; }

uint64_t GgufFile::alignment() const { return state().parsed.alignment; }

uint64_t GgufFile::data_offset() const { return state().parsed.data_offset; }

}  // namespace gaac::model
