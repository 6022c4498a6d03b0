// GGUF reading: the two real models, a round trip of every value type through a small writer, and
// rejection of malformed files (every truncation, bad headers, bad values, bad tensors).
#include "model/gguf.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gaac/error.hpp"
#include "support/models.hpp"

namespace gaac::model {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// A tiny GGUF writer (little-endian, versions 2 and 3), flexible enough to write malformed files.

using Bytes = std::vector<uint8_t>;

void put_le(Bytes& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u32(Bytes& out, uint32_t v) { put_le(out, v, 4); }
void put_u64(Bytes& out, uint64_t v) { put_le(out, v, 8); }
void put_str(Bytes& out, const std::string& s) {
  put_u64(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

/// An encoded value: its type id and its bytes (without the type id).
struct Value {
  uint32_t type;
  Bytes bytes;
};

Value scalar(GgufType type, uint64_t bits, int n) {
  Value v{static_cast<uint32_t>(type), {}};
  put_le(v.bytes, bits, n);
  return v;
}
Value u8(uint8_t v) { return scalar(GgufType::u8, v, 1); }
Value i8(int8_t v) { return scalar(GgufType::i8, static_cast<uint8_t>(v), 1); }
Value u16(uint16_t v) { return scalar(GgufType::u16, v, 2); }
Value i16(int16_t v) { return scalar(GgufType::i16, static_cast<uint16_t>(v), 2); }
Value u32(uint32_t v) { return scalar(GgufType::u32, v, 4); }
Value i32(int32_t v) { return scalar(GgufType::i32, static_cast<uint32_t>(v), 4); }
Value u64(uint64_t v) { return scalar(GgufType::u64, v, 8); }
Value i64(int64_t v) { return scalar(GgufType::i64, static_cast<uint64_t>(v), 8); }
Value f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return scalar(GgufType::f32, bits, 4);
}
Value f64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  return scalar(GgufType::f64, bits, 8);
}
Value boolean(bool v) { return scalar(GgufType::boolean, v ? 1 : 0, 1); }
Value str(const std::string& s) {
  Value v{static_cast<uint32_t>(GgufType::string), {}};
  put_str(v.bytes, s);
  return v;
}
/// An array of `items`, all of type `item_type` (not checked, so that tests may lie).
Value array(GgufType item_type, const std::vector<Value>& items) {
  Value v{static_cast<uint32_t>(GgufType::array), {}};
  put_u32(v.bytes, static_cast<uint32_t>(item_type));
  put_u64(v.bytes, items.size());
  for (const Value& item : items) v.bytes.insert(v.bytes.end(), item.bytes.begin(), item.bytes.end());
  return v;
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  Bytes data;
  std::optional<uint64_t> offset;  ///< default: after the previous tensor, aligned
};

class Writer {
 public:
  Writer& version(uint32_t v) {
    version_ = v;
    return *this;
  }
  /// Alignment used to place tensors and the data section (write general.alignment separately).
  Writer& alignment(uint64_t a) {
    alignment_ = a;
    return *this;
  }
  Writer& kv(const std::string& key, const Value& value) {
    kvs_.push_back({key, value});
    return *this;
  }
  Writer& tensor(const std::string& name, std::vector<uint64_t> ne, GgmlType type, Bytes data,
                 std::optional<uint64_t> offset = std::nullopt) {
    return tensor_id(name, std::move(ne), static_cast<uint32_t>(type), std::move(data), offset);
  }
  Writer& tensor_id(const std::string& name, std::vector<uint64_t> ne, uint32_t type, Bytes data,
                    std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, std::move(ne), type, std::move(data), offset});
    return *this;
  }

  /// The file; tensor data is not padded after the last tensor.
  Bytes image() const {
    Bytes out = {'G', 'G', 'U', 'F'};
    put_u32(out, version_);
    put_u64(out, tensors_.size());
    put_u64(out, kvs_.size());
    for (const auto& [key, value] : kvs_) {
      put_str(out, key);
      put_u32(out, value.type);
      out.insert(out.end(), value.bytes.begin(), value.bytes.end());
    }
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const TensorSpec& t : tensors_) {
      const uint64_t offset = t.offset.value_or(next);
      offsets.push_back(offset);
      next = align(offset + t.data.size());
      put_str(out, t.name);
      put_u32(out, static_cast<uint32_t>(t.ne.size()));
      for (const uint64_t n : t.ne) put_u64(out, n);
      put_u32(out, t.type);
      put_u64(out, offset);
    }
    out.resize(align(out.size()), 0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].data.empty()) continue;  // so that far-off offsets of empty data cost nothing
      const size_t at = data_start + offsets[i];
      if (out.size() < at + tensors_[i].data.size()) out.resize(at + tensors_[i].data.size(), 0);
      std::copy(tensors_[i].data.begin(), tensors_[i].data.end(), out.begin() + static_cast<ptrdiff_t>(at));
    }
    return out;
  }

 private:
  uint64_t align(uint64_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kvs_;
  std::vector<TensorSpec> tensors_;
};

/// `n` bytes counting up from `first`.
Bytes ramp(size_t n, uint8_t first = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(first + i);
  return b;
}

/// A small valid file with a few keys and tensors of several types; its last tensor is not empty,
/// so every truncation of it is invalid.
Writer sample_writer() {
  Writer w;
  w.kv("general.architecture", str("llama"))
      .kv("general.name", str("tiny"))
      .kv("llama.block_count", u32(2))
      .kv("llama.rope.freq_base", f32(10000.0f))
      .kv("tokenizer.ggml.tokens", array(GgufType::string, {str("<s>"), str("</s>"), str("a")}))
      .kv("tokenizer.ggml.scores", array(GgufType::f32, {f32(0), f32(-1), f32(-2.5f)}))
      .tensor("norm", {8}, GgmlType::f32, ramp(32))
      .tensor("w.q8", {32, 2}, GgmlType::q8_0, ramp(68, 7))
      .tensor("w.q4k", {256, 1}, GgmlType::q4_k, ramp(144, 3));
  return w;
}

GgufFile parse(const Bytes& image) { return GgufFile::parse(image, "test.gguf"); }

/// The message of the gaac::Error that parsing `image` throws ("" and a test failure if none).
std::string parse_error(const Bytes& image) {
  try {
    parse(image);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed without error";
  return "";
}

/// Overwrites `n` little-endian bytes at `at`.
Bytes patched(Bytes image, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) image[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
  return image;
}

// ---------------------------------------------------------------------------------------------
// Small files

TEST(GgufTypes, TableMatchesGgml) {
  EXPECT_STREQ(ggml_type_info(GgmlType::q4_k).name, "Q4_K");
  EXPECT_STREQ(ggml_type_info(static_cast<GgmlType>(99)).name, "unknown");
  EXPECT_EQ(ggml_type_info(GgmlType::f32).block_elements, 1);
  EXPECT_EQ(ggml_type_info(GgmlType::q8_0).block_elements, 32);
  EXPECT_EQ(ggml_type_info(GgmlType::q6_k).block_elements, 256);
  EXPECT_EQ(ggml_type_info(static_cast<GgmlType>(9)).block_elements, 0);
  EXPECT_EQ(ggml_type_info(GgmlType::f16).block_bytes, 2u);
  EXPECT_EQ(ggml_type_info(GgmlType::bf16).block_bytes, 2u);
  EXPECT_EQ(ggml_type_info(GgmlType::q4_0).block_bytes, 18u);
  EXPECT_EQ(ggml_type_info(GgmlType::q4_1).block_bytes, 20u);
  EXPECT_EQ(ggml_type_info(GgmlType::q5_0).block_bytes, 22u);
  EXPECT_EQ(ggml_type_info(GgmlType::q5_1).block_bytes, 24u);
  EXPECT_EQ(ggml_type_info(GgmlType::q8_0).block_bytes, 34u);
  EXPECT_EQ(ggml_type_info(GgmlType::q4_k).block_bytes, 144u);
  EXPECT_EQ(ggml_type_info(GgmlType::q5_k).block_bytes, 176u);
  EXPECT_EQ(ggml_type_info(GgmlType::q6_k).block_bytes, 210u);
  EXPECT_EQ(ggml_type_info(static_cast<GgmlType>(9)).block_bytes, 0u);
  for (const uint32_t id : {0u, 1u, 2u, 3u, 6u, 7u, 8u, 12u, 13u, 14u, 30u}) {
    EXPECT_TRUE(supported_type(static_cast<GgmlType>(id))) << id;
  }
  for (const uint32_t id : {4u, 5u, 9u, 10u, 11u, 15u, 29u, 31u, 1000u}) {
    EXPECT_FALSE(supported_type(static_cast<GgmlType>(id))) << id;
  }
  EXPECT_STREQ(value_type_name(7), "bool");
  EXPECT_STREQ(value_type_name(13), "unknown");
}

TEST(GgufTypes, TheReaderAcceptsExactlyTheTableTypesAtTheirSizes) {
  // Every id up to past BF16, plus ids far off: a tensor of two rows of 256 elements (a whole number
  // of blocks of every type) is accepted exactly when the type is in the table, and its bytes are
  // then the table's block bytes per block.
  std::vector<uint32_t> ids;
  for (uint32_t id = 0; id <= 40; ++id) ids.push_back(id);
  for (const uint32_t id : {1000u, 0x7FFFFFFFu, 0xFFFFFFFFu}) ids.push_back(id);
  int accepted = 0;
  for (const uint32_t id : ids) {
    const GgmlTypeInfo& info = ggml_type_info(static_cast<GgmlType>(id));
    if (!supported_type(static_cast<GgmlType>(id))) {
      Writer w;
      w.tensor_id("t", {256, 2}, id, ramp(1024));
      EXPECT_NE(parse_error(w.image()).find("unknown ggml type id " + std::to_string(id)), std::string::npos) << id;
      continue;
    }
    ++accepted;
    const size_t row_bytes = static_cast<size_t>(256 / info.block_elements) * info.block_bytes;
    Writer w;
    w.tensor_id("t", {256, 2}, id, ramp(2 * row_bytes));
    const GgufFile f = parse(w.image());
    const GgufTensor& t = f.tensors().at(0);
    EXPECT_EQ(static_cast<uint32_t>(t.type), id);
    EXPECT_EQ(&ggml_type_info(t.type), &info) << id;
    EXPECT_EQ(t.row_bytes(), row_bytes) << info.name;
    EXPECT_EQ(t.bytes.size(), 2 * row_bytes) << info.name;
  }
  EXPECT_EQ(accepted, static_cast<int>(std::size(kGgmlTypes)));
}

TEST(GgufParse, EveryValueTypeRoundTrips) {
  const auto nested = array(GgufType::array, {array(GgufType::i16, {i16(-1), i16(2)}), array(GgufType::i16, {})});
  for (const uint32_t version : {2u, 3u}) {
    Writer w;
    w.version(version)
        .kv("u8", u8(200))
        .kv("i8", i8(-100))
        .kv("u16", u16(60000))
        .kv("i16", i16(-30000))
        .kv("u32", u32(4000000000u))
        .kv("i32", i32(-2000000000))
        .kv("f32", f32(1.5f))
        .kv("bool.true", boolean(true))
        .kv("bool.false", boolean(false))
        .kv("string", str("h\xc3\xa9llo"))
        .kv("string.empty", str(""))
        .kv("u64", u64(std::numeric_limits<uint64_t>::max()))
        .kv("i64", i64(std::numeric_limits<int64_t>::min()))
        .kv("f64", f64(3.141592653589793))
        .kv("array.u32", array(GgufType::u32, {u32(1), u32(2), u32(3)}))
        .kv("array.i8", array(GgufType::i8, {i8(-5), i8(5)}))
        .kv("array.u64", array(GgufType::u64, {u64(7)}))
        .kv("array.f32", array(GgufType::f32, {f32(0.25f), f32(-2)}))
        .kv("array.f64", array(GgufType::f64, {f64(1e300)}))
        .kv("array.bool", array(GgufType::boolean, {boolean(true), boolean(false)}))
        .kv("array.string", array(GgufType::string, {str("a"), str(""), str("ccc")}))
        .kv("array.empty", array(GgufType::u8, {}))
        .kv("array.nested", nested);
    const GgufFile f = parse(w.image());
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.label(), "test.gguf");
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.metadata().size(), 23u);
    EXPECT_EQ(f.metadata()[0].first, "u8");
    EXPECT_EQ(f.metadata()[22].first, "array.nested");
    EXPECT_TRUE(f.tensors().empty());

    EXPECT_EQ(f.get_uint("u8"), 200u);
    EXPECT_EQ(f.get_int("i8"), -100);
    EXPECT_EQ(f.get_uint("u16"), 60000u);
    EXPECT_EQ(f.get_int("i16"), -30000);
    EXPECT_EQ(f.get_uint("u32"), 4000000000u);
    EXPECT_EQ(f.get_int("u32"), 4000000000);
    EXPECT_EQ(f.get_int("i32"), -2000000000);
    EXPECT_EQ(f.get_float("f32"), 1.5);
    EXPECT_TRUE(f.get_bool("bool.true"));
    EXPECT_FALSE(f.get_bool("bool.false"));
    EXPECT_EQ(f.get_string("string"), "h\xc3\xa9llo");
    EXPECT_EQ(f.get_string("string.empty"), "");
    EXPECT_EQ(f.get_uint("u64"), std::numeric_limits<uint64_t>::max());
    EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f.get_float("f64"), 3.141592653589793);
    EXPECT_EQ(f.get_ints("array.u32"), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(f.get_ints("array.i8"), (std::vector<int64_t>{-5, 5}));
    EXPECT_EQ(f.get_ints("array.u64"), (std::vector<int64_t>{7}));
    EXPECT_EQ(f.get_floats("array.f32"), (std::vector<float>{0.25f, -2.0f}));
    EXPECT_EQ(std::get<double>(std::get<std::shared_ptr<const GgufArray>>(*f.find("array.f64"))->items[0]), 1e300);
    EXPECT_EQ(f.get_strings("array.string"), (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_TRUE(f.get_ints("array.empty").empty());
    const auto& bools = std::get<std::shared_ptr<const GgufArray>>(*f.find("array.bool"));
    EXPECT_EQ(bools->type, static_cast<uint32_t>(GgufType::boolean));
    EXPECT_EQ(bools->items, (std::vector<GgufValue>{true, false}));

    const auto& outer = std::get<std::shared_ptr<const GgufArray>>(*f.find("array.nested"));
    EXPECT_EQ(outer->type, static_cast<uint32_t>(GgufType::array));
    ASSERT_EQ(outer->items.size(), 2u);
    const auto& inner = std::get<std::shared_ptr<const GgufArray>>(outer->items[0]);
    EXPECT_EQ(inner->type, static_cast<uint32_t>(GgufType::i16));
    EXPECT_EQ(inner->items, (std::vector<GgufValue>{int64_t{-1}, int64_t{2}}));
    EXPECT_TRUE(std::get<std::shared_ptr<const GgufArray>>(outer->items[1])->items.empty());

    // The stored type ids survive widening.
    const std::map<std::string, GgufType> types = {
        {"u8", GgufType::u8},         {"i8", GgufType::i8},           {"u16", GgufType::u16},
        {"i16", GgufType::i16},       {"u32", GgufType::u32},         {"i32", GgufType::i32},
        {"f32", GgufType::f32},       {"bool.true", GgufType::boolean}, {"string", GgufType::string},
        {"array.u32", GgufType::array}, {"u64", GgufType::u64},       {"i64", GgufType::i64},
        {"f64", GgufType::f64},
    };
    for (const auto& [key, type] : types) EXPECT_EQ(f.value_type(key), static_cast<int64_t>(type)) << key;
    EXPECT_EQ(f.value_type("absent"), -1);
    EXPECT_EQ(f.find("absent"), nullptr);
  }
}

/// The message of the gaac::Error that `call` throws.
template <class F>
std::string error_of(F call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(GgufParse, GettersRejectOtherTypesNamingTheKey) {
  Writer w;
  w.kv("n", u32(5))
      .kv("neg", i32(-3))
      .kv("big", u64(std::numeric_limits<uint64_t>::max()))
      .kv("s", str("x"))
      .kv("f", f32(1))
      .kv("ints", array(GgufType::u64, {u64(1), u64(std::numeric_limits<uint64_t>::max())}))
      .kv("strs", array(GgufType::string, {str("a")}));
  const GgufFile f = parse(w.image());
  EXPECT_NE(error_of([&] { f.get_string("missing.key"); }).find("test.gguf: key 'missing.key': missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.get_string("n"); }).find("key 'n': is u32, not a string"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_uint("s"); }).find("key 's': is string, not an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_uint("neg"); }).find("key 'neg': value -3 is negative"), std::string::npos);
  EXPECT_EQ(f.get_int("neg"), -3);
  EXPECT_NE(error_of([&] { f.get_int("big"); }).find("does not fit in int64"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_float("n"); }).find("is u32, not a float"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_bool("f"); }).find("is f32, not a bool"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_ints("ints"); }).find("key 'ints': item 1"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_ints("strs"); }).find("is array of string, not an array of integers"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.get_floats("strs"); }).find("not an array of floats"), std::string::npos);
  EXPECT_NE(error_of([&] { f.get_strings("n"); }).find("is u32, not an array of strings"), std::string::npos);
}

TEST(GgufParse, TensorsAreViewsOfTheirBytes) {
  const Bytes image = sample_writer().image();
  const GgufFile f = parse(image);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens"), (std::vector<std::string>{"<s>", "</s>", "a"}));
  EXPECT_EQ(f.get_floats("tokenizer.ggml.scores"), (std::vector<float>{0, -1, -2.5f}));
  EXPECT_EQ(f.data_offset() % 32, 0u);

  const GgufTensor& norm = f.tensors()[0];
  EXPECT_EQ(norm.name, "norm");
  EXPECT_EQ(norm.type, GgmlType::f32);
  EXPECT_EQ(norm.ne, (std::vector<int64_t>{8}));
  EXPECT_EQ(norm.elements(), 8);
  EXPECT_EQ(norm.rows(), 1);
  EXPECT_EQ(norm.row_bytes(), 32u);
  EXPECT_EQ(Bytes(norm.bytes.begin(), norm.bytes.end()), ramp(32));
  EXPECT_EQ(norm.offset, 0u);
  EXPECT_EQ(norm.bytes.data(), f.tensors()[0].bytes.data());

  const GgufTensor* q8 = f.tensor("w.q8");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8, &f.tensors()[1]);
  EXPECT_EQ(q8->ne, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(q8->row_elements(), 32);
  EXPECT_EQ(q8->rows(), 2);
  EXPECT_EQ(q8->row_bytes(), 34u);
  EXPECT_EQ(q8->offset, 32u);
  EXPECT_EQ(Bytes(q8->bytes.begin(), q8->bytes.end()), ramp(68, 7));

  const GgufTensor* q4k = f.tensor("w.q4k");
  ASSERT_NE(q4k, nullptr);
  EXPECT_EQ(q4k->bytes.size(), 144u);
  EXPECT_EQ(q4k->row_bytes(), 144u);
  EXPECT_EQ(q4k->offset, 128u);
  EXPECT_EQ(f.data_offset() + q4k->offset + q4k->bytes.size(), image.size());  // the last bytes of the file
  EXPECT_EQ(f.tensor("absent"), nullptr);
}

TEST(GgufParse, CustomAlignmentEmptyAndScalarTensors) {
  Writer w;
  w.alignment(64)
      .kv("general.alignment", u32(64))
      .tensor("scalar", {}, GgmlType::f32, ramp(4))
      .tensor("empty", {0, 5}, GgmlType::q4_0, {})
      .tensor("bf16", {3, 2, 1, 1}, GgmlType::bf16, ramp(12));
  const Bytes image = w.image();
  const GgufFile f = parse(image);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  const GgufTensor* scalar = f.tensor("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->ne.empty());
  EXPECT_EQ(scalar->elements(), 1);
  EXPECT_EQ(scalar->rows(), 1);
  EXPECT_EQ(scalar->bytes.size(), 4u);
  const GgufTensor* empty = f.tensor("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->elements(), 0);
  EXPECT_EQ(empty->rows(), 0);
  EXPECT_TRUE(empty->bytes.empty());
  EXPECT_EQ(f.tensor("bf16")->bytes.size(), 12u);
  EXPECT_EQ(f.tensor("bf16")->offset, 64u);

  // Any integer type may carry the alignment.
  Writer w2;
  w2.alignment(16).kv("general.alignment", i64(16)).tensor("t", {4}, GgmlType::f32, ramp(16));
  EXPECT_EQ(parse(w2.image()).alignment(), 16u);
  // A file of no tensors may end at the end of its metadata, before any padding.
  Writer w3;
  w3.kv("k", u8(1));
  Bytes header_only = w3.image();
  header_only.resize(24 + 8 + 1 + 4 + 1);
  EXPECT_EQ(parse(header_only).get_uint("k"), 1u);
}

TEST(GgufParse, DefaultConstructedFileIsEmpty) {
  const GgufFile f;
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.find("x"), nullptr);
  EXPECT_EQ(f.tensor("x"), nullptr);
  EXPECT_THROW(f.get_string("x"), Error);
}

TEST(GgufOpen, ReadsTheFileAndReportsSystemErrors) {
  const fs::path dir = fs::temp_directory_path() / ("gaac_gguf_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "tiny.gguf";
  const Bytes image = sample_writer().image();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  }
  {
    const GgufFile f = GgufFile::open(path.string());
    EXPECT_EQ(f.label(), path.string());
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(Bytes(f.tensors()[1].bytes.begin(), f.tensors()[1].bytes.end()), ramp(68, 7));
    EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
  }
  try {
    GgufFile::open((dir / "absent.gguf").string());
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("absent.gguf: cannot open"), std::string::npos) << e.what();
  }
  try {
    GgufFile::open(dir.string());
    ADD_FAILURE() << "opened a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  // An empty file is read, then rejected.
  const fs::path empty = dir / "empty.gguf";
  std::ofstream(empty).close();
  try {
    GgufFile::open(empty.string());
    ADD_FAILURE() << "opened an empty file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too short"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Malformed files

TEST(GgufMalformed, EveryTruncationIsRejected) {
  const Bytes image = sample_writer().image();
  ASSERT_NO_THROW(parse(image));
  for (size_t n = 0; n < image.size(); ++n) {
    const Bytes cut(image.begin(), image.begin() + static_cast<ptrdiff_t>(n));
    try {
      parse(cut);
      ADD_FAILURE() << "a file truncated to " << n << " of " << image.size() << " bytes parsed";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("test.gguf: ", 0), 0u) << what;
      EXPECT_TRUE(what.find("truncated") != std::string::npos || what.find("too short") != std::string::npos ||
                  what.find("past the end") != std::string::npos || what.find("cannot fit") != std::string::npos)
          << n << ": " << what;
    }
  }
}

TEST(GgufMalformed, BadHeaders) {
  const Bytes image = sample_writer().image();
  EXPECT_NE(parse_error(patched(image, 0, 'X', 1)).find("not a GGUF file (magic bytes 58 47 55 46"),
            std::string::npos);
  EXPECT_NE(parse_error({'G', 'G', 'M', 'L', 0, 0}).find("not a GGUF file"), std::string::npos);
  EXPECT_NE(parse_error({'G', 'G', 'U', 'F'}).find("too short for a GGUF header"), std::string::npos);
  EXPECT_NE(parse_error(patched(image, 4, 1, 4)).find("GGUF version 1 is not supported"), std::string::npos);
  EXPECT_NE(parse_error(patched(image, 4, 4, 4)).find("unsupported GGUF version 4"), std::string::npos);
  EXPECT_NE(parse_error(patched(image, 4, 0x03000000, 4)).find("big-endian"), std::string::npos);
  // Counts no file of this size could hold, up to the largest.
  for (const uint64_t n : {uint64_t{1} << 20, uint64_t{1} << 40, std::numeric_limits<uint64_t>::max()}) {
    EXPECT_NE(parse_error(patched(image, 16, n, 8)).find("metadata count " + std::to_string(n) + " cannot fit"),
              std::string::npos);
    EXPECT_NE(parse_error(patched(image, 8, n, 8)).find("tensor count " + std::to_string(n) + " cannot fit"),
              std::string::npos);
  }
  // More keys than written (but few enough to fit): the first key of the tensor section is garbage.
  EXPECT_FALSE(parse_error(patched(image, 16, 7, 8)).empty());
}

TEST(GgufMalformed, BadMetadata) {
  // A string length past the end of the file, in the first key and in a value.
  const Bytes image = sample_writer().image();
  EXPECT_NE(parse_error(patched(image, 24, 1u << 30, 8))
                .find("metadata entry 0: the key's length 1073741824 runs past the end of the file"),
            std::string::npos);
  EXPECT_NE(parse_error(patched(image, 24, std::numeric_limits<uint64_t>::max(), 8)).find("runs past the end"),
            std::string::npos);
  {
    Writer w;
    Value v = str("abc");
    v.bytes[0] = 200;
    w.kv("general.name", v);
    EXPECT_NE(parse_error(w.image()).find("key 'general.name': the string value's length 200 runs past the end"),
              std::string::npos);
  }
  EXPECT_NE(parse_error(Writer().kv("odd", Value{13, {0, 0, 0, 0}}).image()).find("key 'odd': unknown value type id 13"),
            std::string::npos);
  EXPECT_NE(parse_error(Writer().kv("arr", array(static_cast<GgufType>(77), {})).image())
                .find("key 'arr': array of unknown value type id 77"),
            std::string::npos);
  {
    Value huge = array(GgufType::u32, {u32(1)});
    huge.bytes = patched(huge.bytes, 4, std::numeric_limits<uint64_t>::max(), 8);
    EXPECT_NE(parse_error(Writer().kv("huge", huge).image()).find("key 'huge': array of 18446744073709551615 u32 items cannot fit"),
              std::string::npos);
    Value strings = array(GgufType::string, {});
    strings.bytes = patched(strings.bytes, 4, 1u << 20, 8);
    EXPECT_NE(parse_error(Writer().kv("strings", strings).image()).find("cannot fit"), std::string::npos);
  }
  {
    Value v = array(GgufType::u8, {});
    for (int depth = 1; depth < 8; ++depth) v = array(GgufType::array, {v});
    EXPECT_NO_THROW(parse(Writer().kv("deep", v).image()));  // 8 levels
    v = array(GgufType::array, {v});
    EXPECT_NE(parse_error(Writer().kv("deeper", v).image()).find("key 'deeper': arrays nest deeper than 8 levels"),
              std::string::npos);
  }
  EXPECT_NE(parse_error(Writer().kv("b", scalar(GgufType::boolean, 2, 1)).image()).find("key 'b': bool value 2"),
            std::string::npos);
  EXPECT_NE(parse_error(Writer().kv("", u8(1)).image()).find("metadata entry 0: empty key"), std::string::npos);
  EXPECT_NE(parse_error(Writer().kv("a", u8(1)).kv("b", u8(2)).kv("a", u8(3)).image())
                .find("test.gguf: key 'a': appears twice"),
            std::string::npos);
  // general.alignment: an integer power of two.
  EXPECT_NE(parse_error(Writer().kv("general.alignment", u32(48)).image())
                .find("key 'general.alignment': alignment 48 is not a power of two"),
            std::string::npos);
  EXPECT_NE(parse_error(Writer().kv("general.alignment", u32(0)).image()).find("alignment 0 is not a power of two"),
            std::string::npos);
  EXPECT_NE(parse_error(Writer().kv("general.alignment", i32(-32)).image()).find("alignment -32 is not"),
            std::string::npos);
  EXPECT_NE(parse_error(Writer().kv("general.alignment", str("32")).image())
                .find("key 'general.alignment': must be an integer, not string"),
            std::string::npos);
}

TEST(GgufMalformed, BadTensors) {
  const auto f32_tensor = [](Writer& w, const std::string& name, uint64_t n, std::optional<uint64_t> offset = {}) {
    w.tensor(name, {n}, GgmlType::f32, ramp(static_cast<size_t>(4 * n)), offset);
  };
  {
    Writer w;
    w.tensor_id("odd", {32}, 99, ramp(34));
    EXPECT_NE(parse_error(w.image()).find("test.gguf: tensor 'odd': unknown ggml type id 99"), std::string::npos);
    Writer w2;
    w2.tensor_id("q8_1", {32}, 9, ramp(36));
    EXPECT_NE(parse_error(w2.image()).find("tensor 'q8_1': unknown ggml type id 9"), std::string::npos);
  }
  {
    Writer w;
    f32_tensor(w, "a", 8);
    f32_tensor(w, "b", 8, 16);
    EXPECT_NE(parse_error(w.image()).find("tensor 'b': data offset 16 is not a multiple of the alignment 32"),
              std::string::npos);
  }
  {
    Writer w;  // b starts inside a
    f32_tensor(w, "a", 16);
    f32_tensor(w, "b", 8, 32);
    EXPECT_NE(parse_error(w.image()).find("tensor 'b': data overlaps tensor 'a'"), std::string::npos);
  }
  {
    Writer w;  // the same range twice
    f32_tensor(w, "a", 8);
    f32_tensor(w, "b", 8, 0);
    EXPECT_NE(parse_error(w.image()).find("tensor 'b': data overlaps tensor 'a'"), std::string::npos);
  }
  {
    Writer w;  // an empty tensor may sit anywhere inside the data section, even inside another
    f32_tensor(w, "a", 16);
    w.tensor("e", {0}, GgmlType::f32, {}, 32);
    EXPECT_NO_THROW(parse(w.image()));
  }
  {
    Writer w;
    f32_tensor(w, "a", 8);
    w.tensor("b", {64}, GgmlType::f32, ramp(100));  // needs 256 bytes
    EXPECT_NE(parse_error(w.image()).find("tensor 'b': 256 bytes of F32 data at offset 32 run past the end of the "
                                          "132-byte data section"),
              std::string::npos);
    Writer w2;
    w2.tensor("far", {8}, GgmlType::f32, {}, uint64_t{1} << 62);
    EXPECT_NE(parse_error(w2.image()).find("tensor 'far': 32 bytes of F32 data at offset 4611686018427387904 run past"),
              std::string::npos);
    Writer w3;
    w3.tensor("max", {8}, GgmlType::f32, {}, std::numeric_limits<uint64_t>::max() - 31);
    EXPECT_NE(parse_error(w3.image()).find("run past the end"), std::string::npos);
  }
  {
    Writer w;
    w.tensor("t5", {1, 1, 1, 1, 4}, GgmlType::f32, ramp(16));
    EXPECT_NE(parse_error(w.image()).find("tensor 't5': n_dims 5 exceeds the maximum of 4"), std::string::npos);
    Writer w2;
    w2.tensor("many", {}, GgmlType::f32, {});
    Bytes image = w2.image();
    // n_dims sits after the name (8-byte length + 4 bytes) at the start of the tensor section.
    EXPECT_NE(parse_error(patched(image, 24 + 8 + 4, 0xFFFFFFFFu, 4)).find("n_dims 4294967295 exceeds"),
              std::string::npos);
  }
  {
    Writer w;
    w.tensor("neg", {std::numeric_limits<uint64_t>::max(), 1}, GgmlType::f32, {});
    EXPECT_NE(parse_error(w.image()).find("tensor 'neg': dimension 0 is 18446744073709551615, beyond int64"),
              std::string::npos);
    Writer w2;
    w2.tensor("wide", {uint64_t{1} << 32, uint64_t{1} << 32, 0}, GgmlType::f32, {});
    EXPECT_NE(parse_error(w2.image()).find("tensor 'wide': element count overflows at dimension 1"),
              std::string::npos);
    Writer w3;
    w3.tensor("bytes", {uint64_t{1} << 62}, GgmlType::f32, {});
    EXPECT_NE(parse_error(w3.image()).find("tensor 'bytes': byte size of shape [4611686018427387904] of F32 overflows"),
              std::string::npos);
    Writer w4;  // a 0 in a later dimension does not excuse a row too large to address
    w4.tensor("row", {uint64_t{1} << 62, 0}, GgmlType::f32, {});
    EXPECT_NE(parse_error(w4.image()).find("byte size"), std::string::npos);
  }
  {
    Writer w;
    w.tensor("q4k", {100, 2}, GgmlType::q4_k, ramp(288));
    EXPECT_NE(parse_error(w.image()).find("tensor 'q4k': rows of 100 elements (shape [100, 2]) are not a multiple of "
                                          "the Q4_K block of 256"),
              std::string::npos);
    Writer w2;
    w2.tensor("s", {}, GgmlType::q8_0, ramp(34));
    EXPECT_NE(parse_error(w2.image()).find("rows of 1 elements"), std::string::npos);
  }
  {
    Writer w;
    f32_tensor(w, "dup", 8);
    f32_tensor(w, "other", 8);
    f32_tensor(w, "dup", 8);
    EXPECT_NE(parse_error(w.image()).find("test.gguf: tensor 'dup': appears twice among the tensors"),
              std::string::npos);
    Writer w2;
    f32_tensor(w2, "", 8);
    EXPECT_NE(parse_error(w2.image()).find("tensor descriptor 0: empty tensor name"), std::string::npos);
  }
  {
    // A tensor name longer than the rest of the file.
    Writer w;
    f32_tensor(w, "name", 8);
    Bytes image = w.image();
    EXPECT_NE(parse_error(patched(image, 24, 1000, 8)).find("tensor descriptor 0: the tensor name's length 1000 runs "
                                                           "past the end"),
              std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// The real models

/// Tensor count per type name.
std::map<std::string, int> census(const GgufFile& f) {
  std::map<std::string, int> counts;
  for (const GgufTensor& t : f.tensors()) ++counts[ggml_type_info(t.type).name];
  return counts;
}

/// Every tensor's size follows from its type and shape, and the tensors tile the data section.
void expect_consistent_sizes(const GgufFile& f, uint64_t file_size) {
  uint64_t total = 0;
  for (const GgufTensor& t : f.tensors()) {
    EXPECT_EQ(t.bytes.size(), static_cast<size_t>(t.rows()) * t.row_bytes()) << t.name;
    const GgmlTypeInfo& info = ggml_type_info(t.type);
    EXPECT_EQ(t.row_bytes(), static_cast<size_t>(t.row_elements() / info.block_elements) * info.block_bytes) << t.name;
    EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
    total += (t.bytes.size() + f.alignment() - 1) / f.alignment() * f.alignment();
  }
  EXPECT_LE(f.data_offset() + total - f.alignment(), file_size);
  EXPECT_GE(f.data_offset() + total, file_size);
}

TEST(GgufRealModels, SmolLM2) {
  GAAC_REQUIRE_MODEL(path, "smollm2");
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count"), 30u);
  EXPECT_EQ(f.get_uint("llama.embedding_length"), 576u);
  EXPECT_EQ(f.get_uint("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count"), 9u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(f.get_uint("llama.context_length"), 8192u);
  EXPECT_EQ(f.get_uint("llama.rope.dimension_count"), 64u);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_ints("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(f.get_strings("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));

  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(census(f), (std::map<std::string, int>{{"F32", 61}, {"Q4_1", 210}, {"Q8_0", 1}}));
  const GgufTensor* embd = f.tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::q8_0);
  EXPECT_EQ(embd->ne, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd->bytes.size(), 49152u * 576 / 32 * 34);
  const GgufTensor* down = f.tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, GgmlType::q4_1);
  EXPECT_EQ(down->ne, (std::vector<int64_t>{1536, 576}));
  EXPECT_EQ(down->bytes.size(), 576u * 1536 / 32 * 20);
  const GgufTensor* norm = f.tensor("blk.29.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, GgmlType::f32);
  EXPECT_EQ(norm->bytes.size(), 576u * 4);
  EXPECT_EQ(f.tensor("output.weight"), nullptr);  // tied to the embedding
  expect_consistent_sizes(f, fs::file_size(path));
}

TEST(GgufRealModels, Gemma3) {
  GAAC_REQUIRE_MODEL(path, "gemma3");
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f.get_uint("gemma3.block_count"), 18u);
  EXPECT_EQ(f.get_uint("gemma3.embedding_length"), 640u);
  EXPECT_EQ(f.get_uint("gemma3.feed_forward_length"), 2048u);
  EXPECT_EQ(f.get_uint("gemma3.attention.head_count"), 4u);
  EXPECT_EQ(f.get_uint("gemma3.attention.head_count_kv"), 1u);
  EXPECT_EQ(f.get_uint("gemma3.attention.key_length"), 256u);
  EXPECT_EQ(f.get_uint("gemma3.attention.value_length"), 256u);
  EXPECT_EQ(f.get_uint("gemma3.attention.sliding_window"), 512u);
  EXPECT_EQ(f.get_uint("gemma3.context_length"), 32768u);
  EXPECT_EQ(f.get_float("gemma3.rope.freq_base"), 1000000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("gemma3.attention.layer_norm_rms_epsilon")), 1e-6f);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens").size(), 262144u);
  EXPECT_EQ(f.get_floats("tokenizer.ggml.scores").size(), 262144u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 2u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 1u);

  EXPECT_EQ(f.tensors().size(), 236u);
  EXPECT_EQ(census(f),
            (std::map<std::string, int>{{"F32", 109}, {"Q8_0", 10}, {"Q5_0", 81}, {"Q4_K", 27}, {"Q6_K", 9}}));
  const GgufTensor* embd = f.tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::q8_0);
  EXPECT_EQ(embd->ne, (std::vector<int64_t>{640, 262144}));
  EXPECT_EQ(embd->bytes.size(), 262144u * 640 / 32 * 34);
  const GgufTensor* k = f.tensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->type, GgmlType::q5_0);
  EXPECT_EQ(k->ne, (std::vector<int64_t>{640, 256}));
  EXPECT_EQ(k->bytes.size(), 256u * 640 / 32 * 22);
  uint64_t total = 0;
  for (const GgufTensor& t : f.tensors()) total += t.bytes.size();
  EXPECT_EQ(total, 246587904u);
  expect_consistent_sizes(f, fs::file_size(path));
}

}  // namespace
}  // namespace gaac::model
