// Safetensors reading and writing: round trips, byte-exact compatibility with the reference
// implementation, and rejection of malformed files.
#include "io/safetensors.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gaac/error.hpp"

namespace gaac::io {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> bytes_of(std::initializer_list<int> values) {
  std::vector<uint8_t> out;
  for (const int v : values) out.push_back(static_cast<uint8_t>(v));
  return out;
}

/// A file image from a header text (used verbatim, no padding) and the data area.
std::vector<uint8_t> image_of(const std::string& header, const std::vector<uint8_t>& data = {}) {
  std::vector<uint8_t> image;
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i)));
  image.insert(image.end(), header.begin(), header.end());
  image.insert(image.end(), data.begin(), data.end());
  return image;
}

SafetensorsFile parse(const std::vector<uint8_t>& image) { return SafetensorsFile::parse(image, "test.safetensors"); }

/// The message of the gaac::Error that parsing `image` throws ("" and a test failure if none).
std::string parse_error(const std::vector<uint8_t>& image) {
  try {
    parse(image);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed without error";
  return "";
}

std::vector<uint8_t> view_bytes(const TensorView& t) { return {t.bytes.begin(), t.bytes.end()}; }

/// A fresh directory under the system's temporary directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("gaac_io_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(path_), {})); }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------------------------------------
// Golden images, produced once with the reference implementation (the Python package
// `safetensors` 0.8.0 from PyPI, whose writer is the same Rust code that
// `safetensors.torch.save_file` calls):
//   safetensors.numpy.save({"a": np.array([1, 2], dtype=np.uint8)})
//   safetensors.serialize({"k.0": bf16 [1,1,2] = (1.0, -2.0), "w": int16 [1] = 3,
//                          "b": bool [1] = True, "z": float64 [] = 0.5}, metadata={"m": "x"})
//   safetensors.numpy.save({})
// Each was printed as Python bytes and is spelt out below.

const std::string kGoldenU8Header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})"
                                    "   ";
const std::string kGoldenMixedHeader =
    R"({"__metadata__":{"m":"x"},"z":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
    R"("k.0":{"dtype":"BF16","shape":[1,1,2],"data_offsets":[8,12]},)"
    R"("w":{"dtype":"I16","shape":[1],"data_offsets":[12,14]},)"
    R"("b":{"dtype":"BOOL","shape":[1],"data_offsets":[14,15]}})"
    "      ";
const std::vector<uint8_t> kGoldenMixedData =
    bytes_of({0, 0, 0, 0, 0, 0, 0xe0, 0x3f, 0x80, 0x3f, 0x00, 0xc0, 0x03, 0x00, 0x01});

std::vector<uint8_t> golden_u8() { return image_of(kGoldenU8Header, {1, 2}); }
std::vector<uint8_t> golden_mixed() { return image_of(kGoldenMixedHeader, kGoldenMixedData); }

TEST(Safetensors, GoldenImagesHaveTheReferenceLengths) {
  // The reference printed a 66-byte file with 0x38 as header length, and a 279-byte one with 0x100.
  EXPECT_EQ(golden_u8().size(), 66u);
  EXPECT_EQ(golden_u8()[0], 0x38);
  EXPECT_EQ(golden_mixed().size(), 279u);
  EXPECT_EQ(golden_mixed()[1], 0x01);
}

TEST(Safetensors, WriterReproducesTheReferenceU8File) {
  SafetensorsWriter writer;
  writer.add("a", Dtype::u8, {2}, bytes_of({1, 2}));
  EXPECT_EQ(writer.image(), golden_u8());
}

TEST(Safetensors, WriterReproducesTheReferenceMixedFile) {
  // Added in another order than written: the writer orders by dtype (as the reference does).
  SafetensorsWriter writer;
  writer.add("b", Dtype::bool_, {1}, bytes_of({1}));
  writer.add("w", Dtype::i16, {1}, bytes_of({3, 0}));
  writer.add("k.0", Dtype::bf16, {1, 1, 2}, bytes_of({0x80, 0x3f, 0x00, 0xc0}));
  writer.add("z", Dtype::f64, {}, bytes_of({0, 0, 0, 0, 0, 0, 0xe0, 0x3f}));
  writer.set_metadata("m", "x");
  EXPECT_EQ(writer.image(), golden_mixed());
}

TEST(Safetensors, WriterReproducesTheReferenceEmptyFile) {
  EXPECT_EQ(SafetensorsWriter().image(), bytes_of({8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '}));
}

TEST(Safetensors, ReadsTheReferenceMixedFile) {
  const SafetensorsFile file = parse(golden_mixed());
  ASSERT_EQ(file.tensors().size(), 4u);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"m", "x"}}));
  const TensorView* k = file.find("k.0");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->dtype, Dtype::bf16);
  EXPECT_EQ(k->shape, (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(k->elements(), 2);
  EXPECT_EQ(view_bytes(*k), bytes_of({0x80, 0x3f, 0x00, 0xc0}));
  const TensorView* z = file.find("z");
  ASSERT_NE(z, nullptr);
  EXPECT_TRUE(z->shape.empty());
  EXPECT_EQ(z->elements(), 1);
  double value = 0;
  std::memcpy(&value, z->bytes.data(), sizeof value);
  EXPECT_EQ(value, 0.5);
  EXPECT_EQ(file.find("missing"), nullptr);
  // Listed in data order.
  EXPECT_EQ(file.tensors()[0].name, "z");
  EXPECT_EQ(file.tensors()[3].name, "b");
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, DtypeSpellingsRoundTrip) {
  for (const Dtype d : {Dtype::bool_, Dtype::u8, Dtype::i8, Dtype::u16, Dtype::i16, Dtype::u32, Dtype::i32,
                        Dtype::u64, Dtype::i64, Dtype::f16, Dtype::bf16, Dtype::f32, Dtype::f64, Dtype::f8_e4m3,
                        Dtype::f8_e5m2}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
    EXPECT_GT(dtype_size(d), 0u);
  }
  EXPECT_EQ(dtype_size(Dtype::bf16), 2u);
  EXPECT_EQ(dtype_size(Dtype::f64), 8u);
  EXPECT_EQ(dtype_size(Dtype::f8_e4m3), 1u);
  EXPECT_EQ(parse_dtype("F8_E8M0"), Dtype::other);
  EXPECT_EQ(parse_dtype("bf16"), Dtype::other);  // spellings are case-sensitive
  EXPECT_EQ(dtype_size(Dtype::other), 0u);
}

/// A writer holding tensors of several dtypes and shapes, plus metadata.
SafetensorsWriter varied_writer() {
  SafetensorsWriter writer;
  writer.add("u8", Dtype::u8, {3}, bytes_of({7, 8, 9}));
  writer.add("i32", Dtype::i32, {2, 1}, bytes_of({1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}));
  writer.add("f32", Dtype::f32, {1}, bytes_of({0, 0, 0x80, 0x3f}));
  writer.add("bf16", Dtype::bf16, {2, 2}, bytes_of({1, 2, 3, 4, 5, 6, 7, 8}));
  writer.add("empty", Dtype::f16, {0, 3}, {});
  writer.add("scalar", Dtype::u64, {}, bytes_of({1, 2, 3, 4, 5, 6, 7, 8}));
  writer.set_metadata("format", "gaac-test");
  writer.set_metadata("unicode", "\xc3\xa9t\xc3\xa9 \"quoted\"\n");
  return writer;
}

void expect_varied_content(const SafetensorsFile& file) {
  ASSERT_EQ(file.tensors().size(), 6u);
  EXPECT_EQ(view_bytes(*file.find("u8")), bytes_of({7, 8, 9}));
  EXPECT_EQ(file.find("i32")->shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(file.find("i32")->dtype, Dtype::i32);
  EXPECT_EQ(view_bytes(*file.find("f32")), bytes_of({0, 0, 0x80, 0x3f}));
  EXPECT_EQ(view_bytes(*file.find("bf16")), bytes_of({1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(file.find("empty")->elements(), 0);
  EXPECT_TRUE(file.find("empty")->bytes.empty());
  EXPECT_EQ(file.find("scalar")->elements(), 1);
  EXPECT_EQ(file.metadata().at("format"), "gaac-test");
  EXPECT_EQ(file.metadata().at("unicode"), "\xc3\xa9t\xc3\xa9 \"quoted\"\n");
  const uint8_t* previous = nullptr;
  for (const TensorView& t : file.tensors()) {
    // Data order, each tensor aligned to its element size within the data area.
    if (previous != nullptr) {
      EXPECT_GE(t.bytes.data(), previous);
    }
    previous = t.bytes.data();
    EXPECT_EQ(t.dtype_spelling, dtype_name(t.dtype));
  }
}

TEST(Safetensors, ImageRoundTripsSeveralDtypesAndMetadata) {
  const std::vector<uint8_t> image = varied_writer().image();
  const SafetensorsFile file = parse(image);
  expect_varied_content(file);
  const uint8_t* data_area = file.tensors().front().bytes.data();
  for (const TensorView& t : file.tensors()) {
    EXPECT_EQ(static_cast<size_t>(t.bytes.data() - data_area) % dtype_size(t.dtype), 0u) << t.name;
  }
  EXPECT_EQ((image[0] | image[1] << 8) % 8, 0) << "header padded to 8 bytes";
}

TEST(Safetensors, FileRoundTripLeavesNoTemporaryFiles) {
  TempDir dir;
  const std::string path = dir.file("varied.safetensors");
  varied_writer().write(path);
  varied_writer().write(path);  // replaces the existing file
  EXPECT_EQ(dir.entries(), 1u);
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.label(), path);
  expect_varied_content(file);
}

TEST(Safetensors, ViewsOutliveTheFileObjectThroughCopies) {
  TempDir dir;
  const std::string path = dir.file("a.safetensors");
  varied_writer().write(path);
  std::optional<SafetensorsFile> original = SafetensorsFile::open(path);
  const SafetensorsFile copy = *original;
  original.reset();
  EXPECT_EQ(view_bytes(*copy.find("u8")), bytes_of({7, 8, 9}));
}

TEST(Safetensors, OpenReportsMissingFilesAndDirectories) {
  TempDir dir;
  EXPECT_THROW(SafetensorsFile::open(dir.file("absent.safetensors")), Error);
  EXPECT_THROW(SafetensorsFile::open(dir.file("")), Error);
  const std::string empty = dir.file("empty.safetensors");
  std::ofstream(empty).close();
  EXPECT_THROW(SafetensorsFile::open(empty), Error);
  try {
    SafetensorsFile::open(dir.file("absent.safetensors"));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("absent.safetensors"), std::string::npos) << e.what();
  }
  try {
    parse(bytes_of({1, 2, 3}));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_input);
  }
}

TEST(Safetensors, WriteReportsUnwritableDestinations) {
  TempDir dir;
  try {
    SafetensorsWriter().write(dir.file("no/such/dir/x.safetensors"));
    FAIL() << "wrote into a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, WriterRejectsInconsistentTensors) {
  SafetensorsWriter writer;
  EXPECT_THROW(writer.add("a", Dtype::u16, {3}, bytes_of({1, 2, 3})), Error);
  EXPECT_THROW(writer.add("a", Dtype::u8, {-1}, {}), Error);
  EXPECT_THROW(writer.add("a", Dtype::other, {1}, bytes_of({1})), Error);
  EXPECT_THROW(writer.add("__metadata__", Dtype::u8, {1}, bytes_of({1})), Error);
  EXPECT_THROW(writer.add("a", Dtype::u8, {int64_t{1} << 62, 1 << 8}, {}), Error);
  writer.add("a", Dtype::u8, {1}, bytes_of({1}));
  EXPECT_THROW(writer.add("a", Dtype::u8, {1}, bytes_of({1})), Error);
}

TEST(Safetensors, WriterRejectsNamesThatAreNotUtf8) {
  SafetensorsWriter writer;
  writer.add("bad\xff", Dtype::u8, {1}, bytes_of({1}));
  EXPECT_THROW(writer.image(), Error);
}

TEST(Safetensors, WriterNamesTheMetadataThatIsNotUtf8) {
  SafetensorsWriter writer;
  writer.set_metadata("prompt", "caf\xe9");
  try {
    writer.image();
    FAIL() << "wrote a header that is not UTF-8";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("metadata 'prompt' is not valid UTF-8 (byte 3)"), std::string::npos) << message;
    EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed files

TEST(Safetensors, EveryTruncationIsRejected) {
  for (const std::vector<uint8_t>& image : {golden_u8(), golden_mixed(), varied_writer().image()}) {
    for (size_t length = 0; length < image.size(); ++length) {
      const std::vector<uint8_t> prefix(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(length));
      EXPECT_THROW(parse(prefix), Error) << "length " << length;
    }
    EXPECT_NO_THROW(parse(image));
  }
}

TEST(Safetensors, ErrorsNameTheFileAndTheTensor) {
  const std::string message = parse_error(image_of(R"({"weights.3":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                                                   bytes_of({1, 2})));
  EXPECT_NE(message.find("test.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("weights.3"), std::string::npos) << message;
}

TEST(Safetensors, RejectsBadHeaderLengths) {
  std::vector<uint8_t> image = golden_u8();
  image[0] = 0x39;  // one byte more than the header: eats the first data byte, JSON then runs short
  EXPECT_THROW(parse(image), Error);
  for (const uint64_t n : {uint64_t{66 - 7}, uint64_t{100'000'001}, ~uint64_t{0}, uint64_t{1} << 63}) {
    for (int i = 0; i < 8; ++i) image[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
    EXPECT_THROW(parse(image), Error) << n;
  }
  EXPECT_THROW(parse(bytes_of({0, 0, 0, 0, 0, 0, 0, 0})), Error) << "empty header is not JSON";
}

TEST(Safetensors, RejectsHeadersThatAreNotAJsonObject) {
  for (const std::string header : {"", "not json", "{", "[]", "null", "42", "\"text\"", "{\"a\":1,}",
                                   "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}} trailing",
                                   "{\"\xff\":1}"}) {
    EXPECT_THROW(parse(image_of(header)), Error) << header;
  }
}

TEST(Safetensors, JsonErrorsSayWhereWithoutTheLibrarysWording) {
  const std::string message = parse_error(image_of("{bad"));
  EXPECT_NE(message.find("test.safetensors: header is not valid JSON (at byte 2 of the header: syntax error"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
}

TEST(Safetensors, RecognisesOtherFormatsOfGaac) {
  std::vector<uint8_t> snapshot = bytes_of({0x89, 'G', 'A', 'A', 'C', '\r', '\n', 0x1A});
  snapshot.resize(4096, 0);
  std::string message = parse_error(snapshot);
  EXPECT_NE(message.find("test.safetensors: this is a .gaac snapshot, not a safetensors file"), std::string::npos)
      << message;
  EXPECT_NE(message.find("gaac decompress"), std::string::npos) << message;
  message = parse_error(bytes_of({'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_NE(message.find("this is a GGUF model"), std::string::npos) << message;
}

TEST(Safetensors, RejectsDeepNesting) {
  const std::string deep = std::string(1000, '[') + std::string(1000, ']');
  EXPECT_THROW(parse(image_of(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":)" + deep + "}}")), Error);
  // Unknown fields are ignored, as the reference implementation ignores them.
  EXPECT_NO_THROW(parse(image_of(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":[[1]]}})")));
}

TEST(Safetensors, RejectsRepeatedKeys) {
  const std::string entry = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_THROW(parse(image_of("{\"a\":" + entry + ",\"a\":" + entry + "}", {1})), Error);
  EXPECT_THROW(parse(image_of(R"({"__metadata__":{"k":"1","k":"2"}})")), Error);
  EXPECT_THROW(parse(image_of(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", {1})), Error);
}

TEST(Safetensors, RejectsFieldsOfTheWrongType) {
  const char* entries[] = {
      R"("a":1)",
      R"("a":[])",
      R"("a":{"shape":[1],"data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":[1]})",
      R"("a":{"dtype":8,"shape":[1],"data_offsets":[0,1]})",
      R"("a":{"dtype":null,"shape":[1],"data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":1,"data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":"[1]","data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]})",
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0]})",
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]})",
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":{"0":1}})",
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]})",
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]})",
      R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0.0,1.0]})",
      R"("__metadata__":[])",
      R"("__metadata__":"x")",
      R"("__metadata__":{"k":1})",
      R"("__metadata__":{"k":null})",
      R"("__metadata__":{"k":{"nested":"x"}})",
  };
  for (const char* entry : entries) {
    EXPECT_THROW(parse(image_of(std::string("{") + entry + "}", {1})), Error) << entry;
  }
}

TEST(Safetensors, RejectsOffsetsOutsideTheDataArea) {
  const std::vector<uint8_t> data = bytes_of({1, 2, 3, 4});
  for (const char* offsets : {"[0,5]", "[4,5]", "[3,2]", "[5,5]", "[18446744073709551615,18446744073709551615]",
                              "[0,18446744073709551615]", "[18446744073709551615,0]"}) {
    const std::string header = std::string(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":)") + offsets + "}}";
    EXPECT_THROW(parse(image_of(header, data)), Error) << offsets;
  }
  // Offsets that do not fit in 64 bits are a parse-level type error, not a wrap-around.
  EXPECT_THROW(parse(image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551616,0]}})", data)),
               Error);
}

TEST(Safetensors, RejectsOverlappingTensors) {
  const std::string message = parse_error(
      image_of(R"({"first":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
               R"("second":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
               bytes_of({1, 2, 3})));
  EXPECT_NE(message.find("first"), std::string::npos) << message;
  EXPECT_NE(message.find("second"), std::string::npos) << message;
  EXPECT_THROW(parse(image_of(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                              bytes_of({1, 2}))),
               Error)
      << "identical ranges";
  EXPECT_THROW(parse(image_of(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
                              bytes_of({1, 2, 3, 4}))),
               Error)
      << "one range inside another";
}

TEST(Safetensors, AcceptsEmptyTensorsAnywhereAndUnusedBytes) {
  // Empty tensors own no bytes, so they overlap nothing. Unused bytes between tensors are
  // tolerated (the reference writer never leaves any, but the layout stays unambiguous).
  const SafetensorsFile file = parse(image_of(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                              R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                                              R"("b":{"dtype":"U8","shape":[1],"data_offsets":[6,7]}})",
                                              bytes_of({1, 2, 3, 4, 5, 6, 7, 8})));
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(view_bytes(*file.find("b")), bytes_of({7}));
}

TEST(Safetensors, RejectsShapesThatDisagreeWithTheByteCount) {
  const std::vector<uint8_t> data = bytes_of({1, 2, 3, 4, 5, 6, 7, 8});
  for (const char* entry : {R"("a":{"dtype":"U16","shape":[3],"data_offsets":[0,4]})",
                            R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]})",
                            R"("a":{"dtype":"BF16","shape":[],"data_offsets":[0,4]})",
                            R"("a":{"dtype":"U8","shape":[0],"data_offsets":[0,1]})",
                            R"("a":{"dtype":"F64","shape":[1],"data_offsets":[0,0]})"}) {
    EXPECT_THROW(parse(image_of(std::string("{") + entry + "}", data)), Error) << entry;
  }
}

TEST(Safetensors, RejectsShapesWhoseProductOverflows) {
  for (const char* shape : {"[4294967296,4294967296]", "[9223372036854775807,2]", "[9223372036854775808]",
                            "[18446744073709551615]", "[4611686018427387904]" /* ×4 bytes overflows */,
                            "[3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3,3]"}) {
    const std::string header = std::string(R"({"a":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,4]}})";
    EXPECT_THROW(parse(image_of(header, bytes_of({1, 2, 3, 4}))), Error) << shape;
  }
  // A zero anywhere makes the product zero however large the other dimensions are.
  const SafetensorsFile file =
      parse(image_of(R"({"a":{"dtype":"F32","shape":[0,9223372036854775807,9223372036854775807],"data_offsets":[0,0]}})"));
  EXPECT_EQ(file.tensors().at(0).elements(), 0);
}

TEST(Safetensors, KeepsUnknownDtypesWithTheirSpelling) {
  const SafetensorsFile file =
      parse(image_of(R"({"q":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]}})", bytes_of({1, 2})));
  const TensorView* q = file.find("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, Dtype::other);
  EXPECT_EQ(q->dtype_spelling, "F8_E8M0");
  EXPECT_EQ(q->bytes.size(), 2u);
}

}  // namespace
}  // namespace gaac::io
