// KV dumps on disk: bit-exact round trips and clear refusals of anything that is not a KV dump.
#include "io/kv_dump_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"
#include "io/safetensors.hpp"

namespace gaac {
namespace {

namespace fs = std::filesystem;

/// A fresh file path in its own temporary directory, removed at the end of the test.
class TempPath {
 public:
  TempPath() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("gaac_kv_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~TempPath() { fs::remove_all(dir_); }
  std::string path() const { return (dir_ / "dump.safetensors").string(); }

 private:
  fs::path dir_;
};

KvDump small_dump(int head_dim = 64) {
  return make_synthetic_kv({.layers = 3, .kv_heads = 2, .head_dim = head_dim, .tokens = 17, .seed = 7});
}

void expect_same_dump(const KvDump& a, const KvDump& b) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    for (const auto member : {&KvLayer::k, &KvLayer::v}) {
      const KvTensor& x = a.layers[i].*member;
      const KvTensor& y = b.layers[i].*member;
      EXPECT_EQ(x.tokens, y.tokens) << "layer " << i;
      EXPECT_EQ(x.kv_heads, y.kv_heads) << "layer " << i;
      EXPECT_EQ(x.head_dim, y.head_dim) << "layer " << i;
      EXPECT_TRUE(x.data == y.data) << "layer " << i << " differs";
    }
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

/// The message of the gaac::Error that loading `path` throws ("" and a test failure if none).
std::string load_error(const std::string& path) {
  try {
    io::load_kv_dump(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "loaded without error";
  return "";
}

/// Adds a BF16 tensor of the given shape, filled with a counting pattern.
void add_bf16(io::SafetensorsWriter& writer, const std::string& name, std::vector<int64_t> shape) {
  int64_t elements = 1;
  for (const int64_t d : shape) elements *= d;
  std::vector<uint8_t> bytes(static_cast<size_t>(elements) * 2);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  writer.add(name, io::Dtype::bf16, std::move(shape), bytes);
}

/// A writer holding a well-formed dump of `layers` layers, 4 tokens, 2 heads, head_dim 64.
io::SafetensorsWriter valid_writer(int layers) {
  io::SafetensorsWriter writer;
  for (int i = 0; i < layers; ++i) {
    add_bf16(writer, "k." + std::to_string(i), {4, 2, 64});
    add_bf16(writer, "v." + std::to_string(i), {4, 2, 64});
  }
  return writer;
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "\"" << message << "\" lacks \"" << part << "\"";
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(KvDump, SyntheticDumpRoundTripsBitExactWithMetadata) {
  TempPath tmp;
  KvDump dump = small_dump();
  dump.metadata = {{"model", "synthetic"}, {"engine", "test"}};
  io::save_kv_dump(dump, tmp.path());
  const KvDump loaded = io::load_kv_dump(tmp.path());
  // Metadata comes back sorted by key (a safetensors header holds it as a map).
  dump.metadata = {{"engine", "test"}, {"model", "synthetic"}};
  expect_same_dump(dump, loaded);
  EXPECT_EQ(loaded.kv_heads(), 2);
  EXPECT_EQ(loaded.head_dim(), 64);
}

TEST(KvDump, EverySupportedHeadDimRoundTrips) {
  for (const int head_dim : {64, 128, 256}) {
    TempPath tmp;
    const KvDump dump = small_dump(head_dim);
    io::save_kv_dump(dump, tmp.path());
    expect_same_dump(dump, io::load_kv_dump(tmp.path()));
  }
}

TEST(KvDump, LayersMayHoldDifferentTokenCountsIncludingZero) {
  TempPath tmp;
  KvDump dump = small_dump();
  for (KvTensor* t : {&dump.layers[1].k, &dump.layers[1].v}) {
    t->tokens = 0;
    t->data.clear();
  }
  for (KvTensor* t : {&dump.layers[2].k, &dump.layers[2].v}) {
    t->tokens = 5;
    t->data.resize(t->elements());
  }
  io::save_kv_dump(dump, tmp.path());
  expect_same_dump(dump, io::load_kv_dump(tmp.path()));
}

TEST(KvDump, ManyLayersAreOrderedNumericallyNotAlphabetically) {
  TempPath tmp;
  const KvDump dump = make_synthetic_kv({.layers = 12, .kv_heads = 1, .head_dim = 64, .tokens = 3, .seed = 3});
  io::save_kv_dump(dump, tmp.path());
  expect_same_dump(dump, io::load_kv_dump(tmp.path()));
}

TEST(KvDump, EmptyDumpRoundTrips) {
  TempPath tmp;
  io::save_kv_dump(KvDump{}, tmp.path());
  const KvDump loaded = io::load_kv_dump(tmp.path());
  EXPECT_TRUE(loaded.layers.empty());
  EXPECT_EQ(loaded.kv_heads(), 0);
  EXPECT_EQ(loaded.bf16_bytes(), 0u);
}

TEST(KvDump, Bf16BytesCountsEveryKAndVElement) {
  const KvDump dump = small_dump();
  EXPECT_EQ(dump.bf16_bytes(), size_t{3} * 2 * 17 * 2 * 64 * 2);
}

// ---------------------------------------------------------------------------------------------
// Refusals when loading

TEST(KvDump, RejectsOtherDtypesNamingTheTensorAndDtype) {
  TempPath tmp;
  io::SafetensorsWriter writer = valid_writer(1);
  writer.add("k.1", io::Dtype::f16, {4, 2, 64}, std::vector<uint8_t>(4 * 2 * 64 * 2));
  add_bf16(writer, "v.1", {4, 2, 64});
  writer.write(tmp.path());
  const std::string message = load_error(tmp.path());
  expect_contains(message, tmp.path());
  expect_contains(message, "'k.1'");
  expect_contains(message, "F16");
  expect_contains(message, "never converts");
}

TEST(KvDump, RejectsAMissingV) {
  TempPath tmp;
  io::SafetensorsWriter writer = valid_writer(1);
  add_bf16(writer, "k.1", {4, 2, 64});
  writer.write(tmp.path());
  expect_contains(load_error(tmp.path()), "v.1");
}

TEST(KvDump, RejectsAGapInTheLayers) {
  TempPath tmp;
  io::SafetensorsWriter writer = valid_writer(1);
  add_bf16(writer, "k.2", {4, 2, 64});
  add_bf16(writer, "v.2", {4, 2, 64});
  writer.write(tmp.path());
  expect_contains(load_error(tmp.path()), "layer 1");
}

TEST(KvDump, RejectsDumpsThatDoNotStartAtLayerZero) {
  TempPath tmp;
  io::SafetensorsWriter writer;
  add_bf16(writer, "k.1", {4, 2, 64});
  add_bf16(writer, "v.1", {4, 2, 64});
  writer.write(tmp.path());
  expect_contains(load_error(tmp.path()), "layer 0");
}

TEST(KvDump, RejectsExtraTensorsByName) {
  for (const std::string extra : {"bias", "k.01", "k.-1", "k.", "q.0", "k.0.weight", "K.0", "k.99999999"}) {
    TempPath tmp;
    io::SafetensorsWriter writer = valid_writer(2);
    add_bf16(writer, extra, {4, 2, 64});
    writer.write(tmp.path());
    expect_contains(load_error(tmp.path()), "'" + extra + "'");
  }
}

TEST(KvDump, RejectsMismatchedTokenCountsBetweenKAndV) {
  TempPath tmp;
  io::SafetensorsWriter writer = valid_writer(1);
  add_bf16(writer, "k.1", {4, 2, 64});
  add_bf16(writer, "v.1", {5, 2, 64});
  writer.write(tmp.path());
  const std::string message = load_error(tmp.path());
  expect_contains(message, "k.1");
  expect_contains(message, "v.1");
}

TEST(KvDump, RejectsLayersWithOtherHeadsOrHeadDim) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{4, 3, 64}, std::vector<int64_t>{4, 2, 128}}) {
    TempPath tmp;
    io::SafetensorsWriter writer = valid_writer(1);
    add_bf16(writer, "k.1", shape);
    add_bf16(writer, "v.1", shape);
    writer.write(tmp.path());
    expect_contains(load_error(tmp.path()), "k.1");
  }
}

TEST(KvDump, RejectsUnsupportedHeadDims) {
  for (const int64_t head_dim : {0, 32, 96, 512}) {
    TempPath tmp;
    io::SafetensorsWriter writer;
    add_bf16(writer, "k.0", {4, 2, head_dim});
    add_bf16(writer, "v.0", {4, 2, head_dim});
    writer.write(tmp.path());
    expect_contains(load_error(tmp.path()), "64, 128 or 256");
  }
}

TEST(KvDump, RejectsTensorsThatAreNotThreeDimensional) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{8, 64}, std::vector<int64_t>{1, 4, 2, 64}}) {
    TempPath tmp;
    io::SafetensorsWriter writer;
    add_bf16(writer, "k.0", shape);
    add_bf16(writer, "v.0", shape);
    writer.write(tmp.path());
    expect_contains(load_error(tmp.path()), "k.0");
  }
}

TEST(KvDump, RejectsZeroHeads) {
  TempPath tmp;
  io::SafetensorsWriter writer;
  add_bf16(writer, "k.0", {4, 0, 64});
  add_bf16(writer, "v.0", {4, 0, 64});
  writer.write(tmp.path());
  expect_contains(load_error(tmp.path()), "kv_heads");
}

TEST(KvDump, RejectsMissingAndMalformedFiles) {
  TempPath tmp;
  expect_contains(load_error(tmp.path()), tmp.path());
  std::vector<uint8_t> image = valid_writer(1).image();
  image.pop_back();  // truncated by one byte
  {
    std::FILE* f = std::fopen(tmp.path().c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(image.data(), 1, image.size(), f);
    std::fclose(f);
  }
  expect_contains(load_error(tmp.path()), tmp.path());
}

// ---------------------------------------------------------------------------------------------
// Validation and saving

TEST(KvDump, ValidateAcceptsWellFormedDumps) {
  EXPECT_NO_THROW(validate_dump(small_dump()));
  EXPECT_NO_THROW(validate_dump(KvDump{}));
}

TEST(KvDump, ValidateRejectsInconsistentDumps) {
  const auto expect_invalid = [](auto&& mutate, const std::string& part) {
    KvDump dump = small_dump();
    mutate(dump);
    try {
      validate_dump(dump);
      ADD_FAILURE() << "accepted a dump that should fail with " << part;
    } catch (const Error& e) {
      expect_contains(e.what(), part);
    }
  };
  expect_invalid([](KvDump& d) { d.layers[1].v.data.pop_back(); }, "v.1");
  expect_invalid([](KvDump& d) { d.layers[2].k.head_dim = 128; }, "k.2");
  expect_invalid([](KvDump& d) { d.layers[0].k.head_dim = d.layers[0].v.head_dim = 32; }, "64, 128 or 256");
  expect_invalid([](KvDump& d) { d.layers[1].k.tokens = -1; }, "k.1");
  expect_invalid([](KvDump& d) { d.layers[1].v.kv_heads = 0; }, "v.1");
  expect_invalid(
      [](KvDump& d) {
        d.layers[1].v.tokens = 16;
        d.layers[1].v.data.resize(d.layers[1].v.elements());
      },
      "same token count");
  expect_invalid(
      [](KvDump& d) {
        d.layers[0].k.tokens = d.layers[0].v.tokens = 1 << 30;
        d.layers[0].k.kv_heads = d.layers[0].v.kv_heads = 1 << 30;
      },
      "k.0");
}

TEST(KvDump, SaveRefusesAnInvalidDumpAndWritesNothing) {
  TempPath tmp;
  KvDump dump = small_dump();
  dump.layers[0].v.data.clear();
  EXPECT_THROW(io::save_kv_dump(dump, tmp.path()), Error);
  EXPECT_FALSE(fs::exists(tmp.path()));
}

TEST(KvDump, SaveNeverWritesOverAnInput) {
  TempPath tmp;
  io::save_kv_dump(small_dump(), tmp.path());
  const std::vector<std::string> inputs{tmp.path()};
  try {
    io::save_kv_dump(small_dump(128), tmp.path(), inputs);
    FAIL() << "wrote over its input";
  } catch (const Error& e) {
    expect_contains(e.what(), "is also an input");
  }
  expect_same_dump(io::load_kv_dump(tmp.path()), small_dump());
}

TEST(KvDump, ACalibrationTableIsNamedAsSuch) {
  TempPath tmp;
  io::SafetensorsWriter writer;
  writer.set_metadata("format", "gaac-calibration");
  writer.write(tmp.path());
  expect_contains(load_error(tmp.path()), tmp.path() + ": this is a calibration table, not a KV dump");
}

TEST(KvDump, SaveRefusesRepeatedMetadataKeys) {
  TempPath tmp;
  KvDump dump = small_dump();
  dump.metadata = {{"a", "1"}, {"a", "2"}};
  EXPECT_THROW(io::save_kv_dump(dump, tmp.path()), Error);
}

}  // namespace
}  // namespace gaac
