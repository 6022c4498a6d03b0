// The .gaac snapshot container: bit-exact round trips, and refusal (with a clear gaac::Error, never a
// crash) of truncated, bit-flipped and structurally hostile images. Structural corruptions are made
// with their checksums recomputed, so that the validation behind the checksums is what is tested.
#include "gaac/snapshot.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "gaac/stats.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"

namespace gaac {
namespace {

namespace fs = std::filesystem;
using Image = std::vector<uint8_t>;

constexpr TensorKind kKinds[] = {TensorKind::key, TensorKind::value};

// ---- building dumps -----------------------------------------------------------------------------

/// A synthetic dump whose layer l keeps tokens[l] tokens, with some special values sprinkled in.
KvDump varied_dump(int heads, int head_dim, const std::vector<int>& tokens, uint64_t seed) {
  const int most = *std::max_element(tokens.begin(), tokens.end());
  KvDump dump = make_synthetic_kv({.layers = static_cast<int>(tokens.size()), .kv_heads = heads, .head_dim = head_dim,
                                   .tokens = most, .seed = seed});
  const uint16_t specials[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFFFF, 0x0001, 0x807F, 0x7F7F};
  for (size_t l = 0; l < tokens.size(); ++l) {
    for (KvTensor* t : {&dump.layers[l].k, &dump.layers[l].v}) {
      t->tokens = tokens[l];
      t->data.resize(t->elements());
      for (size_t i = 0; i < t->data.size(); i += 97) t->data[i] = specials[(i / 97) % std::size(specials)];
    }
  }
  dump.metadata = {{"source", "snapshot test"}, {"model", "Ünïcode ✓"}, {"empty", ""}, {"source", "duplicate key"}};
  return dump;
}

CalibrationTable calibrated(const KvDump& dump) {
  const KvDump* dumps[] = {&dump};
  CalibrationTable table = calibrate(dumps);
  table.metadata()["note"] = "calibrated in the snapshot test";
  return table;
}

void expect_same_dump(const KvDump& a, const KvDump& b) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    for (const auto member : {&KvLayer::k, &KvLayer::v}) {
      const KvTensor& x = a.layers[l].*member;
      const KvTensor& y = b.layers[l].*member;
      EXPECT_EQ(x.tokens, y.tokens) << "layer " << l;
      EXPECT_EQ(x.kv_heads, y.kv_heads) << "layer " << l;
      EXPECT_EQ(x.head_dim, y.head_dim) << "layer " << l;
      EXPECT_TRUE(x.data == y.data) << "layer " << l << (member == &KvLayer::k ? " K" : " V") << " differs";
    }
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

void expect_same_calibration(const CalibrationTable& x, const CalibrationTable& y) {
  ASSERT_EQ(x.layers(), y.layers());
  ASSERT_EQ(x.kv_heads(), y.kv_heads());
  ASSERT_EQ(x.head_dim(), y.head_dim());
  for (const TensorKind kind : kKinds) {
    for (int l = 0; l < x.layers(); ++l) {
      EXPECT_EQ(x.escape_capacity(kind, l), y.escape_capacity(kind, l));
      for (int h = 0; h < x.kv_heads(); ++h) {
        const auto x3 = x.b3(kind, l, h), y3 = y.b3(kind, l, h), x4 = x.b4(kind, l, h), y4 = y.b4(kind, l, h);
        EXPECT_TRUE(std::equal(x3.begin(), x3.end(), y3.begin()));
        EXPECT_TRUE(std::equal(x4.begin(), x4.end(), y4.begin()));
      }
    }
  }
  EXPECT_EQ(x.metadata(), y.metadata());
}

// ---- round trips --------------------------------------------------------------------------------

class RoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(RoundTrip, IsBitExact) {
  const int head_dim = GetParam();
  const int heads = head_dim == 256 ? 1 : 2;
  // Token counts: not a multiple of 16, a multiple, zero, under one block, several blocks.
  const KvDump dump = varied_dump(heads, head_dim, {37, 48, 0, 9, 80}, static_cast<uint64_t>(head_dim));
  CalibrationTable table = calibrated(dump);
  // Capacity 0 sends every tile that needs an escape byte to raw storage.
  table.set_escape_capacity(TensorKind::key, 1, 0);
  table.set_escape_capacity(TensorKind::value, 4, 0);
  const DumpStats stats = measure(dump, table);
  EXPECT_EQ(stats.layers[1].k.fallback_tiles, stats.layers[1].k.tiles);
  EXPECT_GT(stats.layers[1].k.tiles, 0u);
  EXPECT_GT(stats.layers[4].v.fallback_tiles, 0u);
  EXPECT_LT(stats.layers[0].k.fallback_tiles, stats.layers[0].k.tiles);  // and slots elsewhere

  const Image image = snapshot_image(dump, table);
  EXPECT_EQ(image.size() % 64, 0u);
  const Snapshot back = parse_snapshot(image, "round trip");
  expect_same_dump(dump, back.dump);
  expect_same_calibration(table, back.calibration);
  // Writing what was read gives the very same bytes.
  EXPECT_TRUE(snapshot_image(back.dump, back.calibration) == image);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, RoundTrip, ::testing::Values(64, 128, 256));

TEST(Snapshot, EveryLayerEmptyRoundTrips) {
  const KvDump dump = varied_dump(3, 128, {0, 0}, 1);
  const CalibrationTable table = calibrated(dump);
  const Snapshot back = parse_snapshot(snapshot_image(dump, table), "empty");
  expect_same_dump(dump, back.dump);
  expect_same_calibration(table, back.calibration);
}

TEST(Snapshot, FileRoundTripAndProgress) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::temp_directory_path() / ("gaac_snapshot_" + std::string(info->name()) + "_" +
                                                    std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "kv.gaac").string();
  const KvDump dump = varied_dump(2, 64, {33, 16, 5}, 4);
  const CalibrationTable table = calibrated(dump);
  size_t writes = 0, reads = 0;
  write_snapshot(dump, table, path, [&](size_t done, size_t total) {
    EXPECT_EQ(total, 3u);
    EXPECT_EQ(done, ++writes);
  });
  const Snapshot back = read_snapshot(path, [&](size_t done, size_t total) {
    EXPECT_EQ(total, 3u);
    EXPECT_EQ(done, ++reads);
  });
  EXPECT_EQ(writes, 3u);
  EXPECT_EQ(reads, 3u);
  expect_same_dump(dump, back.dump);
  expect_same_calibration(table, back.calibration);
  EXPECT_THROW(read_snapshot((dir / "missing.gaac").string()), Error);
  fs::remove_all(dir);
}

TEST(Snapshot, WriterRejectsMismatchedCalibration) {
  const KvDump dump = varied_dump(2, 64, {20}, 2);
  EXPECT_THROW(snapshot_image(dump, CalibrationTable(2, 2, 64)), Error);
  EXPECT_THROW(snapshot_image(dump, CalibrationTable(1, 1, 64)), Error);
  EXPECT_THROW(snapshot_image(dump, CalibrationTable(1, 2, 128)), Error);
}

// ---- the container, taken apart and put back together --------------------------------------------

uint64_t get_le(const Image& img, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(img.at(at + static_cast<size_t>(i))) << (8 * i);
  return v;
}
void put_le(Image& img, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) img.at(at + static_cast<size_t>(i)) = static_cast<uint8_t>(v >> (8 * i));
}

constexpr size_t kHeader = 32;
constexpr size_t kEntry = 32;

/// One section-table entry (src/io/snapshot.cpp: u32 type, u32 index, u64 offset, u64 bytes, u64 xxh64).
struct Entry {
  uint32_t type;
  uint32_t index;
  uint64_t offset;
  uint64_t bytes;
  uint64_t hash;
};

size_t section_count(const Image& img) { return static_cast<size_t>(get_le(img, 12, 4)); }

Entry entry(const Image& img, size_t i) {
  const size_t at = kHeader + i * kEntry;
  return {static_cast<uint32_t>(get_le(img, at, 4)), static_cast<uint32_t>(get_le(img, at + 4, 4)), get_le(img, at + 8, 8),
          get_le(img, at + 16, 8), get_le(img, at + 24, 8)};
}

void set_entry(Image& img, size_t i, const Entry& e) {
  const size_t at = kHeader + i * kEntry;
  put_le(img, at, e.type, 4);
  put_le(img, at + 4, e.index, 4);
  put_le(img, at + 8, e.offset, 8);
  put_le(img, at + 16, e.bytes, 8);
  put_le(img, at + 24, e.hash, 8);
}

/// Recomputes the XXH64 of every section that lies inside the image, then that of the section table,
/// so that a deliberate corruption gets past the checksums to the structural validation.
void recompute_checksums(Image& img) {
  const size_t count = std::min(section_count(img), (img.size() - kHeader) / kEntry);
  for (size_t i = 0; i < count; ++i) {
    Entry e = entry(img, i);
    if (e.offset <= img.size() && e.bytes <= img.size() - e.offset) {
      e.hash = XXH64(img.data() + e.offset, e.bytes, 0);
      set_entry(img, i, e);
    }
  }
  put_le(img, 24, XXH64(img.data() + kHeader, count * kEntry, 0), 8);
}

/// Mutable view of one section's bytes inside the image.
uint8_t* section_data(Image& img, size_t i) { return img.data() + entry(img, i).offset; }

/// The sections of an image as separate byte strings, and the reverse: a fresh, consistent image.
struct Section {
  uint32_t type;
  uint32_t index;
  std::vector<uint8_t> bytes;
};

std::vector<Section> split(const Image& img) {
  std::vector<Section> out;
  for (size_t i = 0; i < section_count(img); ++i) {
    const Entry e = entry(img, i);
    out.push_back({e.type, e.index, {img.begin() + static_cast<std::ptrdiff_t>(e.offset),
                                     img.begin() + static_cast<std::ptrdiff_t>(e.offset + e.bytes)}});
  }
  return out;
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

Image assemble(const std::vector<Section>& sections) {
  Image img(align64(kHeader + kEntry * sections.size()), 0);
  const uint8_t magic[8] = {0x89, 'G', 'A', 'A', 'C', '\r', '\n', 0x1A};
  std::copy(std::begin(magic), std::end(magic), img.begin());
  put_le(img, 8, kSnapshotVersion, 2);
  put_le(img, 10, kTileFormatVersion, 2);
  put_le(img, 12, sections.size(), 4);
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
    set_entry(img, i, {s.type, s.index, img.size(), s.bytes.size(), 0});
    img.insert(img.end(), s.bytes.begin(), s.bytes.end());
    img.resize(align64(img.size()), 0);
  }
  put_le(img, 16, img.size(), 8);
  recompute_checksums(img);
  return img;
}

/// The message of the gaac::Error that parsing `img` throws ("" and a test failure if none).
std::string parse_error(const Image& img) {
  try {
    parse_snapshot(img, "test.gaac");
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than gaac::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "parsed without error";
  return "";
}

#define EXPECT_PARSE_ERROR(img, substring)                                                             \
  do {                                                                                                 \
    const std::string message_ = parse_error(img);                                                     \
    EXPECT_NE(message_.find(substring), std::string::npos) << "message: " << message_ << "\nwanted: " \
                                                           << (substring);                             \
    EXPECT_EQ(message_.rfind("test.gaac: ", 0), 0u) << "message does not name the file: " << message_; \
  } while (0)

/// Small images: one layer, one head, head_dim 64, 17 tokens (one tile and a one-token tail). The
/// capacity, 16 below the largest, leaves the slots room to spare and the tensor sections 48 bytes
/// of padding (2160 bytes each), so that a section one byte too long still lies inside the file.
class Malformed : public ::testing::Test {
 protected:
  void SetUp() override {
    dump = varied_dump(1, 64, {17}, 3);
    table = calibrated(dump);
    for (const TensorKind kind : kKinds) table.set_escape_capacity(kind, 0, capacity);
    image = snapshot_image(dump, table);
    ASSERT_EQ(section_count(image), 4u);
    ASSERT_NO_THROW(parse_snapshot(image, "control"));
    // Section 2 is layer 0 K: a 16-byte storage map, one slot, then the tail token.
    ASSERT_EQ(entry(image, 2).bytes, 16 + shape.slot_bytes(capacity) + 2 * 64);
    ASSERT_EQ(entry(image, 2).bytes % 64, 48u);
    ASSERT_EQ(section_data(image, 2)[0], 0) << "tile 0 should be a slot";
  }
  /// Byte `at` of the slot of tile 0 of layer 0 K.
  uint8_t& slot_byte(Image& img, size_t at) { return section_data(img, 2)[16 + at]; }

  const TileShape shape{TensorKind::key, 64};
  const size_t capacity = shape.max_slot_capacity() - 16;
  KvDump dump;
  CalibrationTable table;
  Image image;
};

TEST_F(Malformed, TruncationAtEveryLength) {
  for (size_t n = 0; n < image.size(); ++n) {
    const Image cut(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string message = parse_error(cut);
    ASSERT_FALSE(message.empty()) << "length " << n;
    if (n < 32) {
      ASSERT_NE(message.find("too short to be a .gaac file"), std::string::npos) << message;
    } else {
      ASSERT_NE(message.find("(truncated or padded)"), std::string::npos) << message;
    }
  }
  Image longer = image;
  longer.push_back(0);
  EXPECT_PARSE_ERROR(longer, "its header says " + std::to_string(image.size()));
}

TEST_F(Malformed, TruncationWithTheHeaderPatched) {
  // The file-size field is updated to match each truncation: the section bounds catch it, and a cut
  // that only removes zero padding after the last section is caught by the end-of-file rule.
  const size_t sections_end = entry(image, 3).offset + entry(image, 3).bytes;
  ASSERT_LT(sections_end, image.size());
  for (size_t n = kHeader; n < image.size(); ++n) {
    Image cut(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(n));
    put_le(cut, 16, n, 8);
    if (n >= sections_end) {
      EXPECT_PARSE_ERROR(cut, "file does not end at the 64-byte boundary");
      continue;
    }
    const std::string message = parse_error(cut);
    ASSERT_FALSE(message.empty()) << "length " << n;
    const bool explained = message.find("section table runs past the end") != std::string::npos ||
                           message.find("lies outside the file") != std::string::npos ||
                           message.find("checksum mismatch") != std::string::npos;
    ASSERT_TRUE(explained) << "length " << n << ": " << message;
  }
}

TEST_F(Malformed, SingleBitFlipsAnywhere) {
  // Every byte covered by the header, the table or a section is protected by a checksum, and the
  // padding between and after sections must be zero: no single bit flip anywhere goes unnoticed.
  std::vector<bool> covered(image.size(), false);
  for (size_t i = 0; i < kHeader + kEntry * section_count(image); ++i) covered[i] = true;
  for (size_t s = 0; s < section_count(image); ++s) {
    const Entry e = entry(image, s);
    for (size_t i = e.offset; i < e.offset + e.bytes; ++i) covered[i] = true;
  }
  size_t rejected = 0, tolerated = 0;
  for (size_t i = 0; i < image.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      Image flipped = image;
      flipped[i] ^= static_cast<uint8_t>(1u << bit);
      try {
        const Snapshot s = parse_snapshot(flipped, "flipped");
        ++tolerated;
        ASSERT_FALSE(covered[i]) << "flip of bit " << bit << " of byte " << i << " went unnoticed";
        expect_same_dump(dump, s.dump);
      } catch (const Error& e) {
        ++rejected;
        ASSERT_NE(std::string(e.what()).find("flipped: "), std::string::npos);
      } catch (const std::exception& e) {
        FAIL() << "byte " << i << " bit " << bit << ": threw something other than gaac::Error: " << e.what();
      }
    }
  }
  EXPECT_EQ(tolerated, 0u);
  EXPECT_EQ(rejected, 8 * image.size());
}

TEST_F(Malformed, ChecksumsAndHeader) {
  Image img = image;
  section_data(img, 3)[100] ^= 1;
  EXPECT_PARSE_ERROR(img, "section 3 checksum mismatch");
  img = image;
  img[kHeader + 2 * kEntry + 8] ^= 0x40;  // offset of section 2, table checksum left stale
  EXPECT_PARSE_ERROR(img, "section table checksum mismatch");
  img = image;
  img[1] = 'X';
  EXPECT_PARSE_ERROR(img, "not a .gaac file (bad magic)");
  img = image;
  put_le(img, 8, 4, 2);
  EXPECT_PARSE_ERROR(img, "container version 4 is not supported here (expected 1 or 2)");
  img = image;
  put_le(img, 8, 1, 2);  // version 1 is BF16 without element_format; this metadata names one
  EXPECT_PARSE_ERROR(img, "metadata of a version-1 snapshot names an element format");
  img = image;
  put_le(img, 10, 7, 2);
  EXPECT_PARSE_ERROR(img, "tile format version 7 is not supported");
  img = image;
  put_le(img, 16, image.size() + 64, 8);
  EXPECT_PARSE_ERROR(img, "(truncated or padded)");
}

TEST_F(Malformed, SectionCount) {
  Image img = image;
  put_le(img, 12, 0xFFFFFFFF, 4);
  EXPECT_PARSE_ERROR(img, "section table runs past the end of the file");
  img = image;
  put_le(img, 12, 0, 4);  // a shorter table moves where the first section must start
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "file does not end at the 64-byte boundary");
  img = image;
  put_le(img, 12, 3, 4);  // drop the V section's entry
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "section 0 does not start at the next 64-byte boundary");
  auto only_metadata = split(image);
  only_metadata.resize(1);
  EXPECT_PARSE_ERROR(assemble(only_metadata), "sections must start with metadata and calibration");
  auto without_v = split(image);
  without_v.pop_back();
  EXPECT_PARSE_ERROR(assemble(without_v), "expected one section per layer and K/V");
  auto sections = split(image);
  sections.push_back(sections.back());
  sections.back().index = 2;
  EXPECT_PARSE_ERROR(assemble(sections), "expected one section per layer and K/V");
}

TEST_F(Malformed, SectionOrderAndTypes) {
  Image img = image;
  Entry e0 = entry(img, 0), e1 = entry(img, 1);
  std::swap(e0.type, e1.type);
  set_entry(img, 0, e0);
  set_entry(img, 1, e1);
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "sections must start with metadata and calibration");

  auto sections = split(image);
  std::swap(sections[2], sections[3]);
  EXPECT_PARSE_ERROR(assemble(sections), "tensor sections out of order");
  sections = split(image);
  sections[3].index = 3;
  EXPECT_PARSE_ERROR(assemble(sections), "tensor sections out of order");
  sections = split(image);
  sections[2].type = 4;
  EXPECT_PARSE_ERROR(assemble(sections), "tensor sections out of order");
  sections = split(image);
  EXPECT_NO_THROW(parse_snapshot(assemble(sections), "reassembled"));  // the helper itself is sound
  EXPECT_TRUE(assemble(sections) == image);
}

TEST_F(Malformed, OverlappingAndOutOfBoundsSections) {
  const Entry e0 = entry(image, 0), e1 = entry(image, 1), e2 = entry(image, 2), e3 = entry(image, 3);
  struct Case {
    size_t section;
    uint64_t offset;
    uint64_t bytes;
    const char* message;
  };
  const Case cases[] = {
      // starts one byte before the end of the previous section
      {1, e0.offset + e0.bytes - 1, e1.bytes, "section 1 lies outside the file or overlaps another"},
      {2, e1.offset + e1.bytes - 1, e2.bytes, "section 2 lies outside the file or overlaps another"},
      // starts inside the section table, or inside the header
      {0, kHeader + 4 * kEntry - 1, e0.bytes, "section 0 lies outside the file or overlaps another"},
      {0, 0, e0.bytes, "section 0 lies outside the file or overlaps another"},
      // the same offset as the previous section
      {2, e1.offset, e2.bytes, "section 2 lies outside the file or overlaps another"},
      // grows into the next section: the next one is the overlapping one
      {1, e1.offset, e2.offset - e1.offset + 1, "section 2 lies outside the file or overlaps another"},
      // beyond the end of the file, sizes that would overflow offset + bytes
      {3, image.size() + 64, 0, "section 3 lies outside the file"},
      {3, image.size() + 1, e3.bytes, "section 3 lies outside the file"},
      {3, e3.offset, uint64_t{1} << 40, "section 3 lies outside the file"},
      {3, e3.offset, ~uint64_t{0}, "section 3 lies outside the file"},
      {3, ~uint64_t{0} - 7, 16, "section 3 lies outside the file"},
      {3, e3.offset, image.size() - e3.offset + 1, "section 3 lies outside the file"},
  };
  for (const Case& c : cases) {
    Image img = image;
    Entry e = entry(img, c.section);
    e.offset = c.offset;
    e.bytes = c.bytes;
    set_entry(img, c.section, e);
    recompute_checksums(img);
    SCOPED_TRACE(testing::Message() << "section " << c.section << " at " << c.offset << ", " << c.bytes << " bytes");
    EXPECT_PARSE_ERROR(img, c.message);
  }
  // Touching but not overlapping: section 0 moved to end exactly where section 1 starts (no longer
  // 64-byte aligned): refused, since sections must sit where the layout puts them.
  Image img = image;
  Entry e = entry(img, 0);
  e.offset = e1.offset - e0.bytes;
  std::copy_n(image.begin() + static_cast<std::ptrdiff_t>(e0.offset), e0.bytes,
              img.begin() + static_cast<std::ptrdiff_t>(e.offset));
  set_entry(img, 0, e);
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "section 0 does not start at the next 64-byte boundary");
}

TEST_F(Malformed, SectionSizesOffByOne) {
  for (const int delta : {-1, +1}) {
    SCOPED_TRACE(delta);
    Image img = image;
    Entry e = entry(img, 1);
    e.bytes += static_cast<uint64_t>(delta);
    set_entry(img, 1, e);
    recompute_checksums(img);
    EXPECT_PARSE_ERROR(img, "calibration section has the wrong size");
    for (const size_t s : {size_t{2}, size_t{3}}) {
      img = image;
      e = entry(img, s);
      e.bytes += static_cast<uint64_t>(delta);
      set_entry(img, s, e);
      recompute_checksums(img);
      EXPECT_PARSE_ERROR(img, std::string(s == 2 ? "layer 0 K" : "layer 0 V") + ": section is " +
                                  std::to_string(e.bytes) + " bytes, its tiles need " +
                                  std::to_string(e.bytes - static_cast<uint64_t>(delta)));
    }
  }
  Image img = image;
  Entry e = entry(img, 0);
  e.bytes -= 1;  // cuts the closing brace of the JSON
  set_entry(img, 0, e);
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "metadata section is not gaac-snapshot JSON");
}

TEST_F(Malformed, CorruptSlots) {
  {  // Tag value 3 in group 0 of tile 0.
    Image img = image;
    slot_byte(img, shape.tag_offset()) |= 0x03;
    recompute_checksums(img);
    EXPECT_PARSE_ERROR(img, "layer 0 K: tile 0 (block 0, head 0): invalid mode tag 3");
  }
  {  // Every group raw: 5 × 128 escape bytes cannot fit a 576-byte slot.
    Image img = image;
    for (size_t i = 0; i < shape.tag_bytes(); ++i) slot_byte(img, shape.tag_offset() + i) = 0xAA;
    recompute_checksums(img);
    EXPECT_PARSE_ERROR(img, "layer 0 K: tile 0 (block 0, head 0): mode tags need more escape bytes than the slot holds");
  }
  {  // A nonzero byte after the last escape.
    Image img = image;
    uint8_t& last = slot_byte(img, shape.escape_offset() + capacity - 1);
    ASSERT_EQ(last, 0) << "the tile should leave its escape slot partly unused";
    last = 0x10;
    recompute_checksums(img);
    EXPECT_PARSE_ERROR(img, "layer 0 K: tile 0 (block 0, head 0): unused escape-slot bytes are not zero");
  }
}

TEST_F(Malformed, StorageMap) {
  Image img = image;
  section_data(img, 2)[0] = 2;
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "layer 0 K: tile 0 has unknown storage kind");
  img = image;
  section_data(img, 3)[0] = 0xFF;
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "layer 0 V: tile 0 has unknown storage kind");
  img = image;
  section_data(img, 2)[15] = 1;
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "layer 0 K: storage map padding is not zero");
  img = image;
  section_data(img, 2)[0] = 1;  // says raw: the section is now the wrong size
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "layer 0 K: section is");
}

TEST_F(Malformed, CalibrationSection) {
  const size_t per_window = 64;  // 1 layer × 1 head × 64 channels
  Image img = image;
  section_data(img, 1)[3] = kMaxBase3 + 1;  // k.b3
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "calibration base out of range in k");
  img = image;
  section_data(img, 1)[3 * per_window + 9] = kMaxBase4 + 1;  // v.b4
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "calibration base out of range in v");
  img = image;
  put_le(img, entry(img, 1).offset + 4 * per_window, 8, 2);  // K capacity of layer 0
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "calibration of layer 0 K: escape capacity 8 is not a multiple of 16");
  img = image;
  put_le(img, entry(img, 1).offset + 4 * per_window + 2, 0xFFFF, 2);  // V capacity of layer 0
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "calibration of layer 0 V: escape capacity 65535");
  img = image;
  put_le(img, entry(img, 1).offset + 4 * per_window, 16, 2);  // valid, but not what the slots were made with
  recompute_checksums(img);
  EXPECT_PARSE_ERROR(img, "layer 0 K: section is");
}

/// The image with its metadata section replaced by `json`.
Image with_metadata(const Image& image, const std::string& json) {
  auto sections = split(image);
  sections[0].bytes.assign(json.begin(), json.end());
  return assemble(sections);
}

TEST_F(Malformed, HostileMetadata) {
  const std::string tail = R"(, "dump_metadata": [], "calibration_metadata": {}})";
  auto meta = [&](const std::string& layers, const std::string& heads, const std::string& head_dim,
                  const std::string& tokens) {
    return R"({"format": "gaac-snapshot", "element_format": "bf16", "layers": )" + layers + R"(, "kv_heads": )" + heads +
           R"(, "head_dim": )" + head_dim + R"(, "tokens": )" + tokens + tail;
  };
  // Control: the same JSON with the true values parses.
  EXPECT_NO_THROW(parse_snapshot(with_metadata(image, meta("1", "1", "64", "[17]")), "control"));

  const std::pair<std::string, std::string> cases[] = {
      // huge and negative counts
      {meta("1", "1", "64", "[2147483648]"), "bad token count in metadata"},
      {meta("1", "1", "64", "[18446744073709551615]"), "bad token count in metadata"},
      {meta("1", "1", "64", "[-1]"), "bad token count in metadata"},
      {meta("1", "1", "64", "[2147483647]"), "layer 0 K: section shorter than its storage map"},  // legal, but no data
      {meta("100001", "1", "64", "[17]"), "metadata field 'layers' = 100001 out of range"},
      {meta("-1", "1", "64", "[17]"), "metadata field 'layers' = -1 out of range"},
      {meta("0", "1", "64", "[]"), "metadata field 'layers' = 0 out of range"},
      {meta("18446744073709551615", "1", "64", "[17]"), "'layers'"},
      {meta("1", "4097", "64", "[17]"), "metadata field 'kv_heads' = 4097 out of range"},
      {meta("1", "0", "64", "[17]"), "metadata field 'kv_heads' = 0 out of range"},
      {meta("1", "-3", "64", "[17]"), "metadata field 'kv_heads' = -3 out of range"},
      // head widths the format does not define
      {meta("1", "1", "96", "[17]"), "head_dim must be 64, 128 or 256"},
      {meta("1", "1", "512", "[17]"), "metadata field 'head_dim' = 512 out of range"},
      {meta("1", "1", "-64", "[17]"), "metadata field 'head_dim' = -64 out of range"},
      // wrong types
      {meta("\"1\"", "1", "64", "[17]"), "metadata field 'layers' missing or not an integer"},
      {meta("1.0", "1", "64", "[17]"), "metadata field 'layers' missing or not an integer"},
      {meta("1", "true", "64", "[17]"), "metadata field 'kv_heads' missing or not an integer"},
      {meta("1", "1", "null", "[17]"), "metadata field 'head_dim' missing or not an integer"},
      {meta("1", "1", "64", "17"), "metadata 'tokens' is not a list of one count per layer"},
      {meta("1", "1", "64", "{\"0\": 17}"), "metadata 'tokens' is not a list of one count per layer"},
      {meta("1", "1", "64", "[\"17\"]"), "bad token count in metadata"},
      {meta("1", "1", "64", "[17.0]"), "bad token count in metadata"},
      {meta("1", "1", "64", "[[17]]"), "bad token count in metadata"},
      {R"({"format": "gaac-snapshot", "layers": 1, "kv_heads": 1, "head_dim": 64})",
       "metadata 'tokens' is not a list of one count per layer"},
      {R"({"format": "gaac-snapshot", "kv_heads": 1, "head_dim": 64, "tokens": [17]})",
       "metadata field 'layers' missing or not an integer"},
      {R"({"format": "gaac-snapshot", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17], "dump_metadata": [[1, "x"]]})",
       "bad dump_metadata entry"},
      {R"({"format": "gaac-snapshot", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17], "dump_metadata": [["k"]]})",
       "bad dump_metadata entry"},
      {R"({"format": "gaac-snapshot", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17], "dump_metadata": ["kv"]})",
       "bad dump_metadata entry"},
      {R"({"format": "gaac-snapshot", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17], "calibration_metadata": {"a": 1}})",
       "bad calibration_metadata entry"},
      // not snapshot metadata at all
      {R"({"format": "gaac-calibration", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17]})",
       "metadata section is not gaac-snapshot JSON"},
      {R"([1, 1, 64, [17]])", "metadata section is not gaac-snapshot JSON"},
      {"", "metadata section is not gaac-snapshot JSON"},
      {std::string(R"({"format": "gaac-snapshot")") + '\0' + "}", "metadata section is not gaac-snapshot JSON"},
      {"\xff\xfe{}", "metadata section is not gaac-snapshot JSON"},
      // geometry that disagrees with the other sections
      {meta("2", "1", "64", "[17, 17]"), "calibration section has the wrong size"},
      {meta("1", "2", "64", "[17]"), "calibration section has the wrong size"},
      {meta("1", "1", "128", "[17]"), "calibration section has the wrong size"},
      {meta("2", "1", "64", "[17]"), "metadata 'tokens' is not a list of one count per layer"},
      {meta("1", "1", "64", "[17, 17]"), "metadata 'tokens' is not a list of one count per layer"},
      {meta("1", "1", "64", "[16]"), "layer 0 K: section is"},
      {meta("1", "1", "64", "[18]"), "layer 0 K: section is"},
      {meta("1", "1", "64", "[0]"), "layer 0 K: section is"},
      // the element format: named in version 2, one gaac knows, and the one of the other sections
      {R"({"format": "gaac-snapshot", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17]})",
       "metadata field 'element_format' missing or not a string"},
      {R"({"format": "gaac-snapshot", "element_format": "fp16", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17]})",
       "metadata field 'element_format' is not bf16, e4m3 or e5m2"},
      {R"({"format": "gaac-snapshot", "element_format": "e4m3", "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17]})",
       "calibration of layer 0"},
      {R"({"format": "gaac-snapshot", "element_format": "bf16", "scales": true, "layers": 1, "kv_heads": 1, "head_dim": 64, "tokens": [17]})",
       "metadata field 'scales' is not a boolean of an FP8 snapshot"},
  };
  for (const auto& [json, message] : cases) {
    SCOPED_TRACE(json);
    EXPECT_PARSE_ERROR(with_metadata(image, json), message);
  }
}

// A "format" of the wrong JSON type is refused with a gaac::Error, not a JSON library exception.
TEST_F(Malformed, MetadataFormatOfTheWrongTypeIsAGaacError) {
  for (const std::string json : {R"({"format": 7})", R"({"format": null})", R"({"format": ["gaac-snapshot"]})"}) {
    SCOPED_TRACE(json);
    EXPECT_PARSE_ERROR(with_metadata(image, json), "metadata section is not gaac-snapshot JSON");
  }
}

TEST_F(Malformed, LayerCountMismatchWithConsistentCalibration) {
  // Two layers in the metadata and a calibration section sized for two: the missing tensor sections
  // are what gets noticed.
  auto sections = split(image);
  const std::string json =
      R"({"format": "gaac-snapshot", "element_format": "bf16", "layers": 2, "kv_heads": 1, "head_dim": 64, "tokens": [17, 17]})";
  sections[0].bytes.assign(json.begin(), json.end());
  CalibrationTable two(2, 1, 64);
  for (const TensorKind kind : kKinds) {
    for (int l = 0; l < 2; ++l) two.set_escape_capacity(kind, l, capacity);
  }
  sections[1].bytes = split(snapshot_image(varied_dump(1, 64, {17, 17}, 3), two))[1].bytes;
  EXPECT_PARSE_ERROR(assemble(sections), "expected one section per layer and K/V");
}

// A file of a few hundred kilobytes that claims 100,000 layers × 4,096 KV heads × head_dim 256: the
// metadata alone would make the reader allocate 4 × 10¹¹ bytes of calibration bases before checking
// the calibration section's size. docs/format.md: "nothing is allocated beyond what the file's size
// can justify": the calibration section's size is checked before the table is allocated.
TEST_F(Malformed, HugeGeometryIsRefusedWithoutAllocating) {
  std::string tokens = "[0";
  for (int i = 1; i < 100000; ++i) tokens += ",0";
  tokens += "]";
  const std::string json = R"({"format": "gaac-snapshot", "element_format": "bf16", "layers": 100000, "kv_heads": 4096, "head_dim": 256, "tokens": )" +
                           tokens + "}";
  EXPECT_PARSE_ERROR(with_metadata(image, json), "calibration section has the wrong size");
}

TEST(MalformedRandom, SeededCorruptionWithRecomputedChecksumsNeverCrashes) {
  // Random byte changes anywhere in the sections, checksums fixed up: the reader either refuses with
  // a gaac::Error or returns a snapshot of the declared shape. AddressSanitizer watches the reads.
  const KvDump dump = varied_dump(2, 128, {19, 32}, 8);
  const Image image = snapshot_image(dump, calibrated(dump));
  const size_t sections_from = entry(image, 0).offset;
  std::mt19937_64 rng(12345);
  size_t refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Image img = image;
    const int changes = 1 + static_cast<int>(rng() % 4);
    for (int c = 0; c < changes; ++c) {
      const size_t at = sections_from + rng() % (img.size() - sections_from);
      img[at] = static_cast<uint8_t>(rng());
    }
    recompute_checksums(img);
    try {
      const Snapshot s = parse_snapshot(img, "random");
      ASSERT_EQ(s.dump.layers.size(), 2u);
      for (const KvLayer& l : s.dump.layers) ASSERT_EQ(l.k.data.size(), l.k.elements());
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0u);
}

}  // namespace
}  // namespace gaac
