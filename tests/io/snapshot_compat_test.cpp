// Snapshots written before container version 2 still read: a version-1 file written by the gaac of that
// time (tests/data/README.md) decodes to the dump it was made from, and writing it again gives a
// version-2 image that reads back the same.
#include <gtest/gtest.h>

#include "gaac/snapshot.hpp"
#include "io/kv_dump_file.hpp"
#include "io/container.hpp"

namespace gaac {
namespace {

const std::string kData = GAAC_TEST_DATA_DIR;

TEST(SnapshotCompatibility, VersionOneSnapshotsStillRead) {
  const std::vector<uint8_t> image = read_snapshot_image(kData + "/v1-snapshot.gaac");
  ASSERT_EQ(io::get_le(&image[8], 2), 1u) << "the test file must be a version-1 snapshot";
  const Snapshot snapshot = parse_snapshot(image, "v1-snapshot.gaac");
  const KvDump source = io::load_kv_dump(kData + "/v1-snapshot-source.safetensors");
  ASSERT_EQ(snapshot.dump.layers.size(), source.layers.size());
  for (size_t l = 0; l < source.layers.size(); ++l) {
    EXPECT_EQ(snapshot.dump.layers[l].k.data, source.layers[l].k.data) << "layer " << l;
    EXPECT_EQ(snapshot.dump.layers[l].v.data, source.layers[l].v.data) << "layer " << l;
    EXPECT_EQ(snapshot.dump.layers[l].k.tokens, source.layers[l].k.tokens);
  }
  EXPECT_EQ(snapshot.calibration.element_format(), ElementFormat::bf16);
  // Written again: version 2, the same dump.
  const std::vector<uint8_t> again = snapshot_image(snapshot.dump, snapshot.calibration);
  EXPECT_EQ(io::get_le(&again[8], 2), kSnapshotVersion);
  const AnySnapshot back = parse_any_snapshot(again, "again");
  ASSERT_TRUE(std::holds_alternative<Snapshot>(back));
  for (size_t l = 0; l < source.layers.size(); ++l) EXPECT_EQ(std::get<Snapshot>(back).dump.layers[l].v.data, source.layers[l].v.data);
}

}  // namespace
}  // namespace gaac
