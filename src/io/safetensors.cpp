// Safetensors reading and writing. The reader trusts nothing in the file: every length, offset,
// shape and type is checked before any tensor byte is exposed, and every failure is a gaac::Error.
#include "io/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "gaac/error.hpp"
#include "common/utf8.hpp"
#include "io/file_kinds.hpp"
#include "io/files.hpp"
#include "io/output_file.hpp"

namespace gaac::io {
namespace {

using Json = nlohmann::json;

/// Same cap as the reference implementation: larger headers are refused before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
/// A header needs 3 levels (header, tensor entry, shape); deeper ones are refused as hostile.
constexpr int kMaxHeaderDepth = 16;
constexpr const char* kMetadataKey = "__metadata__";
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

/// One known dtype. `reference_rank` is its position in the reference implementation's dtype
/// enum, which orders the tensors of a written file (see data_order()).
struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
  int reference_rank;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::bool_, "BOOL", 1, 0}, {Dtype::u8, "U8", 1, 1},     {Dtype::i8, "I8", 1, 2},
    {Dtype::f8_e5m2, "F8_E5M2", 1, 3}, {Dtype::f8_e4m3, "F8_E4M3", 1, 4},
    {Dtype::i16, "I16", 2, 5},    {Dtype::u16, "U16", 2, 6},   {Dtype::f16, "F16", 2, 7},
    {Dtype::bf16, "BF16", 2, 8},  {Dtype::i32, "I32", 4, 9},   {Dtype::u32, "U32", 4, 10},
    {Dtype::f32, "F32", 4, 11},   {Dtype::f64, "F64", 8, 12},  {Dtype::i64, "I64", 8, 13},
    {Dtype::u64, "U64", 8, 14},
};

/// The table row of a dtype, or nullptr for Dtype::other.
const DtypeInfo* find_dtype(Dtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

/// Throws an error about the file as a whole: "<label>: <message>".
[[noreturn]] void fail_file(const std::string& label, const std::string& message,
                            SourceLocation loc = SourceLocation()) {
  throw Error(label + ": " + message, loc);
}

/// Throws an error about one tensor: "<label>: tensor '<name>': <message>".
[[noreturn]] void fail_tensor(const std::string& label, const std::string& name, const std::string& message,
                              SourceLocation loc = SourceLocation()) {
  throw Error(label + ": tensor " + in_quotes(name) + ": " + message, loc);
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Reads the little-endian header length and checks it against the cap and the image size.
uint64_t read_header_length(std::span<const uint8_t> image, const std::string& label) {
  if (const OtherFormat other = other_format(image); other.what != nullptr) {
    fail_file(label, std::string("this is ") + other.what + ", not a safetensors file (a KV dump or a calibration table); " +
                         other.hint);
  }
  if (image.size() < 8) {
    fail_file(label, "file of " + std::to_string(image.size()) + " bytes is too short for a safetensors header");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | image[static_cast<size_t>(i)];
  if (n > kMaxHeaderBytes) {
    fail_file(label, "header length " + std::to_string(n) + " exceeds the limit of " +
                         std::to_string(kMaxHeaderBytes) + " bytes (not a safetensors file?)");
  }
  if (n > image.size() - 8) {
    fail_file(label, "header length " + std::to_string(n) + " runs past the end of the " +
                         std::to_string(image.size()) + "-byte file (truncated?)");
  }
  return n;
}

/// The JSON library's parse error in plain words: its reason without the library's prefix
/// ("[json.exception.parse_error.101] parse error at line 1, column 5: ").
std::string json_error_reason(const std::string& what) {
  const std::string marker = "parse error";
  size_t from = what.find(marker);
  from = from == std::string::npos ? what.find("] ") : what.find(": ", from);
  return from == std::string::npos ? what : what.substr(from + 2);
}

/// A first, linear pass over the header text (SAX events, no document built): checks syntax and
/// UTF-8, refuses a key repeated within one object, which the JSON library would otherwise resolve
/// silently by keeping one of the two, and nesting deeper than any safetensors header needs, which
/// could otherwise cost far more memory than the header's size. (The library's callback parser
/// would check the same but rescans an object's members whenever one of them ends: quadratic in
/// the tensor count.)
class HeaderChecker : public nlohmann::json_sax<Json> {
 public:
  /// Why the text was refused ("" while it is acceptable).
  const std::string& problem() const { return problem_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }
  bool key(string_t& key) override {
    if (open_.empty() || !open_.back().is_object) return true;
    if (open_.back().keys.insert(key).second) return true;
    problem_ = "header repeats the key " + in_quotes(key);
    return false;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    problem_ = "header is not valid JSON (at byte " + std::to_string(position) + " of the header: " +
               json_error_reason(e.what()) + ")";
    return false;
  }

 private:
  struct Container {
    bool is_object;
    std::unordered_set<std::string> keys;
  };
  bool open(bool is_object) {
    if (open_.size() > static_cast<size_t>(kMaxHeaderDepth)) {
      problem_ = "header nests deeper than " + std::to_string(kMaxHeaderDepth) + " levels";
      return false;
    }
    open_.push_back({is_object, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }
  std::vector<Container> open_;
  std::string problem_;
};

/// Parses the header JSON after HeaderChecker has accepted it.
Json parse_header_json(std::span<const uint8_t> text, const std::string& label) {
  HeaderChecker checker;
  if (!Json::sax_parse(text.begin(), text.end(), &checker) || !checker.problem().empty()) {
    fail_file(label, checker.problem().empty() ? "header is not valid JSON" : checker.problem());
  }
  Json header;
  try {
    header = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    fail_file(label, "header is not valid JSON (" + json_error_reason(e.what()) + ")");
  }
  if (!header.is_object()) fail_file(label, "header must be a JSON object");
  return header;
}

/// Validates `__metadata__`: an object whose values are all strings.
std::map<std::string, std::string> parse_metadata(const Json& value, const std::string& label) {
  if (!value.is_object()) fail_file(label, std::string(kMetadataKey) + " must be an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, entry] : value.items()) {
    if (!entry.is_string()) {
      fail_file(label, std::string(kMetadataKey) + " entry " + in_quotes(key) + " must be a string, not " +
                           entry.type_name());
    }
    metadata.emplace(key, entry.get<std::string>());
  }
  return metadata;
}

/// The named field of a tensor entry; throws when it is absent.
const Json& require_field(const Json& entry, const char* field, const std::string& label, const std::string& name) {
  const auto it = entry.find(field);
  if (it == entry.end()) fail_tensor(label, name, std::string("missing \"") + field + "\"");
  return *it;
}

/// "[2, 3]" for messages.
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

/// Parses a shape and returns it with its element count; the count never overflows int64.
std::pair<std::vector<int64_t>, uint64_t> parse_shape(const Json& value, const std::string& label,
                                                      const std::string& name) {
  if (!value.is_array()) fail_tensor(label, name, "\"shape\" must be an array");
  std::vector<int64_t> shape;
  uint64_t elements = 1;
  for (const Json& dim : value) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > static_cast<uint64_t>(kMaxInt64)) {
      fail_tensor(label, name, "\"shape\" must hold non-negative integers, found " + dim.dump());
    }
    const uint64_t d = dim.get<uint64_t>();
    if (__builtin_mul_overflow(elements, d, &elements) || elements > static_cast<uint64_t>(kMaxInt64)) {
      fail_tensor(label, name, "element count of the shape overflows");
    }
    shape.push_back(static_cast<int64_t>(d));
  }
  return {std::move(shape), elements};
}

/// Validates `data_offsets`: exactly two unsigned integers (their range is checked by the caller).
std::pair<uint64_t, uint64_t> parse_offsets(const Json& value, const std::string& label, const std::string& name) {
  if (!value.is_array() || value.size() != 2 || !value[0].is_number_unsigned() || !value[1].is_number_unsigned()) {
    fail_tensor(label, name, "\"data_offsets\" must be two non-negative integers, found " + value.dump());
  }
  return {value[0].get<uint64_t>(), value[1].get<uint64_t>()};
}

/// Validates one tensor entry against the data area and returns its view.
TensorView parse_tensor(const std::string& name, const Json& entry, std::span<const uint8_t> data,
                        const std::string& label) {
  if (!entry.is_object()) fail_tensor(label, name, "entry must be an object");
  const Json& dtype = require_field(entry, "dtype", label, name);
  if (!dtype.is_string()) fail_tensor(label, name, "\"dtype\" must be a string");
  auto [shape, elements] = parse_shape(require_field(entry, "shape", label, name), label, name);
  const auto [begin, end] = parse_offsets(require_field(entry, "data_offsets", label, name), label, name);
  if (begin > end || end > data.size()) {
    fail_tensor(label, name, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                 "] lie outside the " + std::to_string(data.size()) + "-byte data area" +
                                 (begin <= end ? " (the file is truncated?)" : ""));
  }
  TensorView view;
  view.name = name;
  view.dtype_spelling = dtype.get<std::string>();
  view.dtype = parse_dtype(view.dtype_spelling);
  view.shape = std::move(shape);
  // A dtype unknown to gaac keeps its bytes unchecked; the caller decides whether to refuse it.
  if (view.dtype != Dtype::other) {
    uint64_t expected = 0;
    if (__builtin_mul_overflow(elements, dtype_size(view.dtype), &expected) || expected != end - begin) {
      fail_tensor(label, name, "shape " + shape_text(view.shape) + " of " + view.dtype_spelling + " needs " +
                                   std::to_string(elements) + " x " + std::to_string(dtype_size(view.dtype)) +
                                   " bytes but data_offsets cover " + std::to_string(end - begin));
    }
  }
  view.bytes = data.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
  return view;
}

/// Sorts tensors by data offset and rejects any two whose (non-empty) byte ranges intersect.
void order_and_check_overlap(std::vector<TensorView>& tensors, const uint8_t* data, const std::string& label) {
  const auto begin_of = [data](const TensorView& t) { return static_cast<size_t>(t.bytes.data() - data); };
  std::sort(tensors.begin(), tensors.end(), [&](const TensorView& a, const TensorView& b) {
    return std::tuple(begin_of(a), a.bytes.size(), a.name) < std::tuple(begin_of(b), b.bytes.size(), b.name);
  });
  size_t covered_to = 0;
  const TensorView* covering = nullptr;
  for (const TensorView& t : tensors) {
    if (t.bytes.empty()) continue;  // an empty tensor owns no bytes, so it cannot overlap
    if (covering != nullptr && begin_of(t) < covered_to) {
      fail_tensor(label, t.name, "data overlaps tensor " + in_quotes(covering->name));
    }
    covered_to = begin_of(t) + t.bytes.size();
    covering = &t;
  }
}

/// Everything a valid header describes, with views into `image`.
struct ParsedImage {
  std::vector<TensorView> tensors;
  std::map<std::string, std::string> metadata;
};

/// Validates a whole image: length prefix, header, every tensor and metadata entry.
ParsedImage parse_image(std::span<const uint8_t> image, const std::string& label) {
  const uint64_t header_length = read_header_length(image, label);
  const Json header = parse_header_json(image.subspan(8, static_cast<size_t>(header_length)), label);
  const std::span<const uint8_t> data = image.subspan(8 + static_cast<size_t>(header_length));
  ParsedImage parsed;
  for (const auto& [key, entry] : header.items()) {
    if (key == kMetadataKey) {
      parsed.metadata = parse_metadata(entry, label);
    } else {
      parsed.tensors.push_back(parse_tensor(key, entry, data, label));
    }
  }
  order_and_check_overlap(parsed.tensors, data.data(), label);
  return parsed;
}

// ---------------------------------------------------------------------------------------------
// Writing

/// A writer's tensors in file order: the reference implementation's order (largest dtype rank
/// first, then by name), so that every tensor's data is naturally aligned and our files are
/// byte-identical to the reference's for the same tensors (and at most one metadata entry: the
/// reference writes metadata in hash-map order, gaac in key order).
std::vector<TensorView> data_order(std::vector<TensorView> views) {
  std::sort(views.begin(), views.end(), [](const TensorView& a, const TensorView& b) {
    const int ra = find_dtype(a.dtype)->reference_rank;
    const int rb = find_dtype(b.dtype)->reference_rank;
    return ra != rb ? ra > rb : a.name < b.name;
  });
  return views;
}

/// The file's header (length prefix, JSON and padding) and its tensors in data order.
struct Layout {
  std::vector<uint8_t> header;
  std::vector<TensorView> tensors;
};

/// Throws unless `text` is UTF-8, which a JSON header must be; `what` names it for the message.
void check_utf8(const std::string& text, const std::string& what) {
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string::npos) {
    throw Error("safetensors writer: " + what + " is not valid UTF-8 (byte " + std::to_string(bad) +
                "); a safetensors header holds only UTF-8 text");
  }
}

/// The length prefix and the JSON header, padded with spaces to a multiple of 8 bytes.
std::vector<uint8_t> encode_header(const std::vector<TensorView>& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata) {
    check_utf8(key, "a metadata key");
    check_utf8(value, "metadata " + in_quotes(key));
  }
  for (const TensorView& t : tensors) check_utf8(t.name, "a tensor name");
  // The way the reference implementation writes it: metadata first, tensors in data order, and each
  // entry's fields as dtype, shape, data_offsets. The object is written member by member: an
  // ordered_json would look each new key up among all the earlier ones (quadratic in the tensors).
  // Every string is UTF-8 (checked above), so the strict dumps cannot throw.
  const auto json_text = [](const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  };
  std::string text = "{";
  if (!metadata.empty()) text += json_text(kMetadataKey) + ":" + json_text(metadata);
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.bytes.size()};
    if (text.size() > 1) text += ",";
    text += json_text(t.name);
    text += ":";
    text += json_text(entry);
    offset += t.bytes.size();
  }
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');  // data area starts 8-byte aligned
  std::vector<uint8_t> header(8);
  for (size_t i = 0; i < 8; ++i) header[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  header.insert(header.end(), text.begin(), text.end());
  return header;
}

/// Views of a writer's entries. A template only because the entry type is private to the writer.
template <class Entries>
std::vector<TensorView> entry_views(const Entries& entries) {
  std::vector<TensorView> views;
  views.reserve(entries.size());
  for (const auto& e : entries) {
    TensorView view;
    view.name = e.name;
    view.dtype = e.dtype;
    view.dtype_spelling = dtype_name(e.dtype);
    view.shape = e.shape;
    view.bytes = e.data;
    views.push_back(std::move(view));
  }
  return views;
}

/// Orders the tensors and encodes the header describing them.
Layout lay_out(std::vector<TensorView> views, const std::map<std::string, std::string>& metadata) {
  Layout layout;
  layout.tensors = data_order(std::move(views));
  layout.header = encode_header(layout.tensors, metadata);
  return layout;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Dtypes and views

const char* dtype_name(Dtype dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  return info ? info->name : "other";
}

size_t dtype_size(Dtype dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  return info ? info->size : 0;
}

Dtype parse_dtype(const std::string& name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return Dtype::other;
}

int64_t TensorView::elements() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

/// The bytes of an open file (read into memory, or a copy) and the name index over its tensors.
struct SafetensorsFile::Storage {
  io::FileBytes file;
  std::unordered_map<std::string, size_t> index;

  std::span<const uint8_t> bytes() const { return file.bytes(); }

  /// Validates the stored image and wraps it as a file. (A member so that it may fill the file's
  /// private fields.)
  static SafetensorsFile into_file(std::unique_ptr<Storage> storage, const std::string& label) {
    ParsedImage parsed = parse_image(storage->bytes(), label);
    for (size_t i = 0; i < parsed.tensors.size(); ++i) storage->index.emplace(parsed.tensors[i].name, i);
    SafetensorsFile file;
    file.storage_ = std::move(storage);
    file.label_ = label;
    file.tensors_ = std::move(parsed.tensors);
    file.metadata_ = std::move(parsed.metadata);
    return file;
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto storage = std::make_unique<Storage>();
  storage->file = io::FileBytes::open(path);
  return Storage::into_file(std::move(storage), path);
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> image, const std::string& label) {
  auto storage = std::make_unique<Storage>();
  storage->file = io::FileBytes::copy_of(image);
  return Storage::into_file(std::move(storage), label);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  if (!storage_) return nullptr;
  const auto it = storage_->index.find(name);
  return it == storage_->index.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::add(const std::string& name, Dtype dtype, std::vector<int64_t> shape,
                            std::span<const uint8_t> bytes) {
  const std::string label = "safetensors writer";
  if (name == kMetadataKey) fail_tensor(label, name, "name is reserved for metadata");
  if (dtype == Dtype::other) fail_tensor(label, name, "cannot write a tensor of unknown dtype");
  if (names_.count(name) != 0) fail_tensor(label, name, "added twice");
  uint64_t elements = 1;
  for (const int64_t d : shape) {
    if (d < 0) fail_tensor(label, name, "negative dimension in shape " + shape_text(shape));
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
      fail_tensor(label, name, "element count of shape " + shape_text(shape) + " overflows");
    }
  }
  uint64_t expected = 0;
  if (__builtin_mul_overflow(elements, dtype_size(dtype), &expected) || expected != bytes.size()) {
    fail_tensor(label, name, "shape " + shape_text(shape) + " of " + dtype_name(dtype) + " needs " +
                                 std::to_string(elements) + " elements but " + std::to_string(bytes.size()) +
                                 " bytes were given");
  }
  entries_.push_back({name, dtype, std::move(shape), std::vector<uint8_t>(bytes.begin(), bytes.end())});
  names_.insert(name);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

std::vector<uint8_t> SafetensorsWriter::image() const {
  const Layout layout = lay_out(entry_views(entries_), metadata_);
  std::vector<uint8_t> image = layout.header;
  for (const TensorView& t : layout.tensors) image.insert(image.end(), t.bytes.begin(), t.bytes.end());
  return image;
}

void SafetensorsWriter::write(const std::string& path, std::span<const std::string> inputs) const {
  // Streamed rather than built with image(), so a large dump is not held twice in memory.
  const Layout layout = lay_out(entry_views(entries_), metadata_);
  std::vector<std::span<const uint8_t>> parts{layout.header};
  for (const TensorView& t : layout.tensors) parts.push_back(t.bytes);
  write_output(path, parts, inputs);
}

}  // namespace gaac::io
