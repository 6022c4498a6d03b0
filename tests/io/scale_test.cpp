// Reading and writing cost grows linearly with the number of tensors. These tests run under a
// time limit (tests/CMakeLists.txt): the header parser that rescanned the tensor entries whenever
// one ended, and the writer that compared each new name with every earlier one, needed minutes for
// what now takes about a second.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/kv_dump_file.hpp"
#include "io/safetensors.hpp"
#include "support/temp_dir.hpp"

namespace gaac {
namespace {

constexpr int kLayers = 100'000;  // 200,000 tensors

std::string name_of(int i) {
  std::string name = std::to_string(i);
  name.insert(name.begin(), 't');
  return name;
}

TEST(Scale, SafetensorsWithTwoHundredThousandTensorsRoundTrip) {
  io::SafetensorsWriter writer;
  for (int i = 0; i < 2 * kLayers; ++i) {
    const uint8_t byte = static_cast<uint8_t>(i);
    writer.add(name_of(i), io::Dtype::u8, {1}, std::span(&byte, 1));
  }
  const io::SafetensorsFile file = io::SafetensorsFile::parse(writer.image(), "many.safetensors");
  ASSERT_EQ(file.tensors().size(), static_cast<size_t>(2 * kLayers));
  for (const int i : {0, 12345, 2 * kLayers - 1}) {
    const io::TensorView* t = file.find(name_of(i));
    ASSERT_NE(t, nullptr) << i;
    EXPECT_EQ(t->bytes[0], static_cast<uint8_t>(i));
  }
}

TEST(Scale, KvDumpOfAHundredThousandLayersRoundTrips) {
  test::TempDir dir;
  KvDump dump;
  for (int l = 0; l < kLayers; ++l) {
    KvTensor t{1, 1, 64, std::vector<uint16_t>(64, static_cast<uint16_t>(l))};
    dump.layers.push_back({t, t});
  }
  io::save_kv_dump(dump, dir.file("many.safetensors"));
  const KvDump loaded = io::load_kv_dump(dir.file("many.safetensors"));
  ASSERT_EQ(loaded.layers.size(), dump.layers.size());
  for (const size_t l : {size_t{0}, size_t{777}, size_t{kLayers - 1}}) {
    EXPECT_EQ(loaded.layers[l].v.data, dump.layers[l].v.data) << l;
  }
}

}  // namespace
}  // namespace gaac
