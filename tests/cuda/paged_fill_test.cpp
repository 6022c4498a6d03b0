// The host-side paged-cache builder against docs/format.md section 13: every entry of every block
// row names units that hold exactly the dump's values (slots through the reference decoder, raw
// tiles in one or two units with the partner index), tails are zero-padded, windows release whole
// blocks, and no unit is used twice.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/paged_fill.hpp"
#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda;

std::vector<uint16_t> expected_tile(const KvDump& d, int layer, TensorKind kind, int head, int half, int block, int channels) {
  const KvTensor& t = kind == TensorKind::key ? d.layers[static_cast<size_t>(layer)].k : d.layers[static_cast<size_t>(layer)].v;
  std::vector<uint16_t> tile(static_cast<size_t>(kTileTokens) * channels, 0);
  for (int r = 0; r < kTileTokens; ++r) {
    const int token = block * kTileTokens + r;
    if (token >= t.tokens) break;
    for (int c = 0; c < channels; ++c) tile[static_cast<size_t>(r) * channels + c] = t.at(token, head, half * channels + c);
  }
  return tile;
}

void check_cache(const std::vector<KvDump>& dumps, const HostPagedCache& cache, const HostSequenceTable& table,
                 const CalibrationTable* calibration, const std::vector<int>& windows) {
  const PagedGeometry& geo = cache.geometry;
  const int channels = geo.tile_channels();
  std::vector<int> used(cache.unit_count, 0);
  const auto unit = [&](uint32_t i) {
    EXPECT_LT(i, cache.unit_count);
    ++used[i];
    return cache.units.data() + geo.unit_offset(i);
  };
  ASSERT_EQ(table.lengths.size(), dumps.size());
  for (size_t s = 0; s < dumps.size(); ++s) {
    const int len = table.lengths[s];
    for (int b = table.indptr[s]; b < table.indptr[s + 1]; ++b) {
      const int block = b - table.indptr[s];
      for (int layer = 0; layer < geo.layers; ++layer) {
        const int window = windows.empty() ? 0 : windows[static_cast<size_t>(layer)];
        const bool released = (block + 1) * kTileTokens <= first_attended(len - 1, window);
        for (int head = 0; head < geo.kv_heads; ++head)
          for (const TensorKind kind : {TensorKind::key, TensorKind::value})
            for (int half = 0; half < geo.halves(); ++half) {
              const uint32_t e = cache.entries[geo.entry_index(layer, table.rows[static_cast<size_t>(b)], head, kind, half)];
              if (released) {
                EXPECT_EQ(entry_class(e), TileClass::absent);
                continue;
              }
              const std::vector<uint16_t> want = expected_tile(dumps[s], layer, kind, head, half, block, channels);
              std::vector<uint16_t> got(want.size());
              const TileShape shape{kind, channels};
              if (entry_class(e) == TileClass::compressed) {
                ASSERT_TRUE(calibration);
                ASSERT_EQ(decode_tile(shape, std::span<const uint8_t>(unit(entry_unit(e)), geo.unit_bytes),
                                      geo.escape_capacity(), calibration->tile_bases(kind, layer, head, half), got.data(),
                                      static_cast<size_t>(channels)),
                          DecodeStatus::ok);
                EXPECT_EQ((block + 1) * kTileTokens <= len, true) << "an open block was compressed";
              } else {
                ASSERT_EQ(entry_class(e), TileClass::raw);
                const uint8_t* a = unit(entry_unit(e));
                const uint8_t* rest = a + geo.raw_half_bytes();
                if (geo.raw_split()) {
                  uint32_t partner;
                  std::memcpy(&partner, a + geo.partner_offset(), 4);
                  rest = unit(partner);
                }
                std::memcpy(got.data(), a, geo.raw_half_bytes());
                std::memcpy(got.data() + got.size() / 2, rest, geo.raw_half_bytes());
              }
              EXPECT_EQ(got, want) << "seq " << s << " block " << block << " layer " << layer << " head " << head;
            }
      }
    }
  }
  for (uint32_t i = 0; i < cache.unit_count; ++i) EXPECT_EQ(used[i], 1) << "unit " << i;
}

TEST(PagedFill, CompressedAndBf16CachesHoldTheDumps) {
  std::vector<KvDump> dumps;
  for (const int tokens : {1, 16, 17, 250, 513}) {
    SyntheticKvSpec spec;
    spec.layers = 2, spec.kv_heads = 2, spec.head_dim = 256, spec.tokens = tokens, spec.seed = static_cast<uint64_t>(tokens);
    dumps.push_back(make_synthetic_kv(spec));
  }
  std::vector<const KvDump*> ptrs;
  for (const KvDump& d : dumps) ptrs.push_back(&d);
  const CalibrationTable table = calibrate(ptrs);
  const std::vector<int> windows = {0, 100};
  for (const FillFormat format : {FillFormat::gaac, FillFormat::bf16}) {
    for (const uint64_t shuffle : {uint64_t{0}, uint64_t{7}}) {
      FillOptions options;
      options.format = format;
      options.calibration = &table;
      options.windows = windows;
      options.shuffle_seed = shuffle;
      HostSequenceTable seqs;
      const HostPagedCache cache = fill_paged_cache(ptrs, options, seqs);
      SCOPED_TRACE(testing::Message() << "format " << int(format) << " shuffle " << shuffle);
      EXPECT_EQ(cache.geometry.raw_split(), format == FillFormat::gaac);
      if (format == FillFormat::gaac) {
        EXPECT_GT(cache.counts.compressed_tiles, 0u);
      }
      EXPECT_GT(cache.counts.absent_tiles, 0u);
      EXPECT_GT(cache.counts.tail_tiles, 0u);
      check_cache(dumps, cache, seqs, &table, windows);
    }
  }
}

TEST(PagedFill, TinyCapacityForcesRawTilesInTwoUnits) {
  SyntheticKvSpec spec;
  spec.layers = 1, spec.kv_heads = 3, spec.head_dim = 64, spec.tokens = 300;
  const KvDump dump = make_synthetic_kv(spec);
  const KvDump* ptr = &dump;
  const CalibrationTable table = calibrate(std::span<const KvDump* const>(&ptr, 1));
  FillOptions options;
  options.calibration = &table;
  options.escape_capacity = 0;
  options.escape_capacity_set = true;
  HostSequenceTable seqs;
  const HostPagedCache cache = fill_paged_cache(std::span<const KvDump* const>(&ptr, 1), options, seqs);
  EXPECT_GT(cache.counts.raw_tiles, 0u);
  check_cache({dump}, cache, seqs, &table, {});
}

}  // namespace
}  // namespace gaac
