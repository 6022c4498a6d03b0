// The GPU codec against the CPU's, byte for byte, in both directions:
//   - finalize_blocks() on a cache mirrored to the device gives the slots, entries and free units that
//     KvCache::append gives on the host when the same blocks' 16th tokens arrive;
//   - decompress_dense() of a cache filled on the host gives back every value it holds, in a dense
//     and in a paged layout, compressed and BF16 caches, sliding-window releases left untouched;
//   - cuda::snapshot_image() equals gaac::snapshot_image() and parses back to the dump.
// Inputs: realistic synthetic KV calibrated on another stretch (3-bit, 4-bit and raw groups, raw
// fallbacks), adversarial tiles over uniform bases (all 3-bit, slot exactly full, one byte over, all
// raw, every mode in one row), and all 65,536 BF16 patterns. Skipped, with a message, without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/cache_fill.hpp"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/snapshot.hpp"
#include "gaac/synthetic.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda;

class GpuCodec : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device: GPU codec tests skipped";
  }
};

KvDump synthetic(int layers, int kv_heads, int head_dim, int tokens, uint64_t seed) {
  SyntheticKvSpec spec;
  spec.layers = layers, spec.kv_heads = kv_heads, spec.head_dim = head_dim, spec.tokens = tokens, spec.seed = seed;
  return make_synthetic_kv(spec);
}

/// Realistic sequences of the given lengths and their calibration, learnt on another stretch.
struct Realistic {
  std::vector<KvDump> sequences;
  CalibrationTable table;
};

Realistic realistic(int layers, int kv_heads, int head_dim, const std::vector<int>& lengths, uint64_t seed) {
  int total = 0;
  for (const int n : lengths) total += n;
  constexpr int kCalibrationTokens = 1024;
  const KvDump all = synthetic(layers, kv_heads, head_dim, total + kCalibrationTokens, seed);
  Realistic r;
  for (int at = 0; const int n : lengths) {
    r.sequences.push_back(test::stretch(all, at, n));
    at += n;
  }
  const KvDump calibration_kv = test::stretch(all, total, kCalibrationTokens);
  const KvDump* p = &calibration_kv;
  r.table = calibrate(std::span<const KvDump* const>(&p, 1));
  return r;
}

// ---- adversarial tiles over uniform bases -------------------------------------------------------

constexpr int kB3 = 120, kB4 = 116, kCapacity = 32;

/// A table of `layers` layers whose every channel has bases b3 / b4 and escape capacity `capacity`.
CalibrationTable uniform_table(int layers, int kv_heads, int head_dim, size_t capacity, int b3 = kB3, int b4 = kB4) {
  CalibrationTable t(layers, kv_heads, head_dim);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kv_heads; ++h) {
        std::ranges::fill(t.b3(kind, l, h), static_cast<uint8_t>(b3));
        std::ranges::fill(t.b4(kind, l, h), static_cast<uint8_t>(b4));
      }
      t.set_escape_capacity(kind, l, capacity);
    }
  }
  return t;
}

/// Exponent for an element of a group in `mode`; element 0 of a group decides the mode.
int exponent_for(GroupMode mode, int element, std::mt19937_64& rng) {
  if (mode == GroupMode::bits3) return kB3 + static_cast<int>(rng() % 8);
  if (mode == GroupMode::bits4) return element == 0 ? kB4 + 14 : kB4 + static_cast<int>(rng() % 16);
  return element == 0 ? 200 + static_cast<int>(rng() % 56) : static_cast<int>(rng() % 256);
}

/// The mode of group `pair` of `lane` in adversarial scenario `scenario` (0 all 3-bit, 1 escapes
/// exactly kCapacity, 2 one byte over, 3 all raw, 4 every mode in the first two lanes, so in every
/// row of keys the first lanes hold).
GroupMode scenario_mode(int scenario, TileShape shape, int lane, int pair) {
  const int g = lane * shape.groups_per_lane() + pair;
  switch (scenario) {
    case 1: return g < kCapacity - 10 ? GroupMode::bits4 : g >= 100 && g < 102 ? GroupMode::raw : GroupMode::bits3;
    case 2: return g < kCapacity - 9 ? GroupMode::bits4 : g >= 100 && g < 102 ? GroupMode::raw : GroupMode::bits3;
    case 3: return GroupMode::raw;
    case 4: return lane < 2 ? static_cast<GroupMode>(pair % 3) : GroupMode::bits3;
    default: return GroupMode::bits3;
  }
}

/// Writes an adversarial tile of `scenario` at tokens first..first+15 of (head, half) of `t`.
void write_adversarial_tile(KvTensor& t, TensorKind kind, int first, int head, int half, int scenario,
                            std::mt19937_64& rng) {
  const TileShape shape{kind, std::min(t.head_dim, kMaxTileChannels)};
  for (int lane = 0; lane < kWarpLanes; ++lane) {
    for (int pair = 0; pair < shape.groups_per_lane(); ++pair) {
      const GroupMode mode = scenario_mode(scenario, shape, lane, pair);
      for (int i = 0; i < kGroupSize; ++i) {
        const ElementSlot at = element_slot(shape, lane, 2 * pair + i / kQuadSize, i % kQuadSize);
        const uint16_t x = test::bf16_bits(static_cast<int>(rng() & 1), exponent_for(mode, i, rng), static_cast<int>(rng() % 128));
        t.data[(static_cast<size_t>(first + at.token) * t.kv_heads + head) * t.head_dim + half * shape.channels + at.channel] = x;
      }
    }
  }
}

/// A one-layer dump of `tokens` tokens whose complete blocks are adversarial tiles, the scenario
/// changing from tile to tile; the incomplete block's tokens are random 3-bit values.
KvDump adversarial(int kv_heads, int head_dim, int tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  KvDump d;
  KvLayer layer;
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    KvTensor& t = layer.of(kind);
    t = {tokens, kv_heads, head_dim, std::vector<uint16_t>(static_cast<size_t>(tokens) * kv_heads * head_dim)};
    for (uint16_t& x : t.data) x = test::bf16_bits(static_cast<int>(rng() & 1), kB3 + static_cast<int>(rng() % 8), static_cast<int>(rng() % 128));
    const int halves = head_dim / std::min(head_dim, kMaxTileChannels);
    int scenario = kind == TensorKind::key ? 0 : 3;
    for (int b = 0; b < tokens / kTileTokens; ++b)
      for (int h = 0; h < kv_heads; ++h)
        for (int half = 0; half < halves; ++half) write_adversarial_tile(t, kind, b * kTileTokens, h, half, scenario++ % 5, rng);
  }
  d.layers.push_back(std::move(layer));
  return d;
}

/// All 65,536 BF16 patterns in K and V of one head of width `channels` (fill_pattern_tile's tiles),
/// with a table of uniform bases and the largest escape capacity so every tile is a slot.
std::pair<KvDump, CalibrationTable> every_pattern(int channels) {
  const TileShape shape{TensorKind::key, channels};
  std::vector<uint16_t> data;
  test::TileCase tile = test::uniform_bases_tile(shape, kB3, kB4);
  for (uint32_t next = 0; next < 65536;) {
    next = test::fill_pattern_tile(tile, next);
    data.insert(data.end(), tile.elements.begin(), tile.elements.end());
  }
  const int tokens = static_cast<int>(data.size()) / channels;
  KvDump d;
  KvLayer layer;
  layer.k = {tokens, 1, channels, data};
  std::ranges::reverse(data);  // V sees the patterns in another order and in other places of a tile
  layer.v = {tokens, 1, channels, data};
  d.layers.push_back(std::move(layer));
  return {std::move(d), uniform_table(1, 1, channels, shape.max_slot_capacity())};
}

// ---- finalize ------------------------------------------------------------------------------------

/// Fills a host cache with `sequences` minus their last token, mirrors it to the device, then gives
/// every sequence its last token on both: KvCache::append on the host, a copy into the tail plus
/// finalize_blocks() on the device. Both caches must then hold the same bytes.
void check_finalize(const std::vector<KvDump>& sequences, const CalibrationTable& table) {
  std::vector<KvDump> open;
  for (const KvDump& d : sequences) {
    ASSERT_EQ(d.layers.front().k.tokens % kTileTokens, 0) << "each sequence must end a block";
    open.push_back(test::stretch(d, 0, d.layers.front().k.tokens - 1));
  }
  const int layers = static_cast<int>(table.layers());
  KvCache host(test::cache_config_for(sequences, CacheFormat::gaac, &table, std::vector<int>(static_cast<size_t>(layers), 0)));
  const std::vector<SequenceId> ids = test::fill_cache(host, open);
  CacheMemory device = CacheMemory::upload(host);
  const PagedGeometry& g = host.geometry();
  const PagedCacheView hv = host.view();
  const size_t row_bytes = static_cast<size_t>(g.tile_channels()) * 2;

  // The last token on the device: row 15 of each tail tile is row 7 of its second unit.
  std::vector<uint32_t> rows;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const uint32_t row = host.sequence_table(std::span(&ids[s], 1)).rows.back();
    rows.push_back(row);
    const int last = sequences[s].layers.front().k.tokens - 1;
    for (int l = 0; l < layers; ++l)
      for (int h = 0; h < g.kv_heads; ++h)
        for (const TensorKind kind : {TensorKind::key, TensorKind::value})
          for (int half = 0; half < g.halves(); ++half) {
            const uint32_t e = hv.entries[g.entry_index(l, row, h, kind, half)];
            ASSERT_EQ(entry_class(e), TileClass::raw);
            uint32_t second = 0;
            std::memcpy(&second, hv.units + g.unit_offset(entry_unit(e)) + g.partner_offset(), 4);
            const KvTensor& t = sequences[s].layers[static_cast<size_t>(l)].of(kind);
            const uint16_t* src = t.data.data() + (static_cast<size_t>(last) * t.kv_heads + h) * t.head_dim + half * g.tile_channels();
            ASSERT_EQ(cudaMemcpy(device.view().units + g.unit_offset(second) + 7 * row_bytes, src, row_bytes, cudaMemcpyHostToDevice),
                      cudaSuccess);
          }
  }
  DeviceBuffer device_rows(rows.size() * 4);
  device_rows.upload(rows.data(), rows.size() * 4);
  finalize_blocks(device, static_cast<const uint32_t*>(device_rows.data()), static_cast<int>(rows.size()), 0, layers);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  for (size_t s = 0; s < sequences.size(); ++s) {
    std::vector<KvView> k, v;
    const int last = sequences[s].layers.front().k.tokens - 1;
    for (const KvLayer& l : sequences[s].layers) {
      k.push_back(view_of(l.k).tokens_from(last, 1));
      v.push_back(view_of(l.v).tokens_from(last, 1));
    }
    ASSERT_EQ(host.append(ids[s], k, v).status, CacheStatus::ok);
  }
  host.check_invariants();

  std::vector<uint8_t> units;
  std::vector<uint32_t> entries;
  device.download(units, entries);
  const PagedCacheView after = host.view();
  uint64_t compressed = 0, raw = 0;
  for (size_t i = 0; i < g.table_entries(); ++i) {
    ASSERT_EQ(entries[i], after.entries[i]) << "entry " << i;
    const uint32_t e = entries[i];
    if (entry_class(e) == TileClass::absent) continue;
    const uint32_t unit = entry_unit(e);
    ASSERT_LT(unit, device.units());
    ASSERT_EQ(std::memcmp(units.data() + g.unit_offset(unit), after.units + g.unit_offset(unit), g.unit_bytes), 0)
        << "unit " << unit << " of entry " << i;
    if (entry_class(e) == TileClass::raw) {
      uint32_t second = 0;
      std::memcpy(&second, after.units + g.unit_offset(unit) + g.partner_offset(), 4);
      ASSERT_EQ(std::memcmp(units.data() + g.unit_offset(second), after.units + g.unit_offset(second), g.unit_bytes), 0);
      ++raw;
    } else {
      ++compressed;
    }
  }
  std::vector<uint32_t> device_free = device.free_units(), host_free;
  for (const uint32_t u : host.free_units()) {
    if (u < device.units()) host_free.push_back(u);
  }
  std::ranges::sort(device_free);
  std::ranges::sort(host_free);
  EXPECT_EQ(device_free, host_free) << "the device's free units are not the host's";
  EXPECT_GT(compressed, 0u);
  std::printf("[ finalize ] %zu blocks of %d layers × %d heads × d %d: tables, slots and free units equal "
              "(%llu compressed, %llu raw tiles)\n",
              rows.size(), layers, g.kv_heads, g.head_dim, static_cast<unsigned long long>(compressed),
              static_cast<unsigned long long>(raw));
}

TEST_F(GpuCodec, FinalizeRealisticBatchesEqualsHost) {
  for (const auto& [kv, hd] : {std::pair{8, 128}, {3, 64}, {1, 256}}) {
    SCOPED_TRACE(testing::Message() << kv << " heads × d " << hd);
    std::vector<int> lengths = {16, 64, 1008};
    for (int i = 0; i < 61; ++i) lengths.push_back(16 * (1 + i % 7));  // 64 blocks finalized in one call
    const Realistic r = realistic(2, kv, hd, lengths, 11);
    check_finalize(r.sequences, r.table);
  }
}

TEST_F(GpuCodec, FinalizeAdversarialTilesEqualsHost) {
  for (const auto& [kv, hd] : {std::pair{8, 128}, {3, 64}, {2, 256}}) {
    SCOPED_TRACE(testing::Message() << kv << " heads × d " << hd);
    std::vector<KvDump> seqs;
    for (int s = 0; s < 5; ++s) seqs.push_back(adversarial(kv, hd, 16 * (s + 1), 50 + static_cast<uint64_t>(s)));
    check_finalize(seqs, uniform_table(1, kv, hd, kCapacity));
  }
}

TEST_F(GpuCodec, FinalizeTwiceChangesNothing) {
  const Realistic r = realistic(1, 2, 128, {32, 48}, 3);
  std::vector<KvDump> open;
  for (const KvDump& d : r.sequences) open.push_back(d);  // complete blocks: finalized on the host already
  KvCache host(test::cache_config_for(open, CacheFormat::gaac, &r.table, {0}));
  const std::vector<SequenceId> ids = test::fill_cache(host, open);
  CacheMemory device = CacheMemory::upload(host);
  std::vector<uint8_t> units_before, units_after;
  std::vector<uint32_t> entries_before, entries_after;
  device.download(units_before, entries_before);
  const SequenceTable batch = host.sequence_table(ids);
  DeviceBuffer rows(batch.rows.size() * 4);
  rows.upload(batch.rows.data(), batch.rows.size() * 4);
  finalize_blocks(device, static_cast<const uint32_t*>(rows.data()), static_cast<int>(batch.rows.size()), 0, 1);
  device.download(units_after, entries_after);
  EXPECT_EQ(units_after, units_before);
  EXPECT_EQ(entries_after, entries_before);
  const auto on_device = std::ranges::count_if(host.free_units(), [&](uint32_t u) { return u < device.units(); });
  EXPECT_EQ(device.free_units().size(), static_cast<size_t>(on_device));
}

// ---- decompress ------------------------------------------------------------------------------------

/// Decompresses layers of `cache` (filled with `sequences`) into a dense and a paged layout and
/// checks every held value; released tiles keep the sentinel.
void check_decompress(const KvCache& host, const std::vector<SequenceId>& ids, const std::vector<KvDump>& sequences) {
  const CacheMemory device = CacheMemory::upload(host);
  const SequenceTable batch = host.sequence_table(ids);
  const BatchTable seqs = BatchTable::upload(batch.view());
  const PagedGeometry& g = host.geometry();
  const PagedCacheView hv = host.view();
  const int layers = g.layers, kv = g.kv_heads, hd = g.head_dim, n = static_cast<int>(sequences.size());
  int longest = 0;
  for (const KvDump& d : sequences) longest = std::max(longest, d.layers.front().k.tokens);
  const int64_t row = static_cast<int64_t>(kv) * hd;
  constexpr uint16_t kSentinel = 0x7FC1;
  for (const bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged NHD" : "dense [sequence, token, head, dim]");
    DenseLayout out;
    out.paged = paged;
    out.token_stride = row;
    out.head_stride = hd;
    out.outer_stride = paged ? kTileTokens * row : longest * row;
    const int64_t per_layer = paged ? static_cast<int64_t>(g.row_capacity) * kTileTokens * row : n * longest * row;
    out.layer_stride = per_layer;
    const std::vector<uint16_t> sentinel(static_cast<size_t>(per_layer * layers), kSentinel);
    DeviceBuffer k(sentinel.size() * 2), v(sentinel.size() * 2);
    k.upload(sentinel.data(), sentinel.size() * 2);
    v.upload(sentinel.data(), sentinel.size() * 2);
    out.k = static_cast<uint16_t*>(k.data());
    out.v = static_cast<uint16_t*>(v.data());
    decompress_dense(device, seqs, 0, layers, out);
    std::vector<uint16_t> hk(sentinel.size()), hvv(sentinel.size());
    k.download(hk.data(), hk.size() * 2);
    v.download(hvv.data(), hvv.size() * 2);
    uint64_t checked = 0, released = 0;
    for (int s = 0; s < n; ++s) {
      const int tokens = sequences[static_cast<size_t>(s)].layers.front().k.tokens;
      for (int l = 0; l < layers; ++l)
        for (int p = 0; p < tokens; ++p) {
          const uint32_t brow = batch.rows[static_cast<size_t>(batch.indptr[s] + p / kTileTokens)];
          const int64_t at = l * per_layer + (paged ? brow * out.outer_stride + (p % kTileTokens) * row
                                                    : s * out.outer_stride + p * row);
          for (int h = 0; h < kv; ++h) {
            const bool held = brow != kNoRow &&
                              entry_class(hv.entries[g.entry_index(l, brow, h, TensorKind::key, 0)]) != TileClass::absent;
            for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
              const KvTensor& t = sequences[static_cast<size_t>(s)].layers[static_cast<size_t>(l)].of(kind);
              const std::vector<uint16_t>& got = kind == TensorKind::key ? hk : hvv;
              for (int c = 0; c < hd; ++c) {
                const uint16_t want = held ? t.at(p, h, c) : kSentinel;
                const uint16_t have = got[static_cast<size_t>(at + h * hd + c)];
                if (have != want) {
                  FAIL() << "sequence " << s << " layer " << l << " position " << p << " head " << h << " channel " << c
                         << (kind == TensorKind::key ? " K" : " V") << ": " << have << " != " << want;
                }
              }
            }
            (held ? checked : released) += 1;
          }
        }
    }
    EXPECT_GT(checked, 0u);
    std::printf("[ decompress ] %s, %s cache: %llu (position, head) rows equal, %llu released rows untouched\n",
                paged ? "paged" : "dense", device.compressed() ? "GAAC" : "BF16", static_cast<unsigned long long>(checked),
                static_cast<unsigned long long>(released));
  }
}

TEST_F(GpuCodec, DecompressRealisticCachesEqualsValues) {
  for (const auto& [kv, hd] : {std::pair{8, 128}, {3, 64}, {1, 256}}) {
    SCOPED_TRACE(testing::Message() << kv << " heads × d " << hd);
    const Realistic r = realistic(2, kv, hd, {1, 15, 16, 17, 700, 1003}, 21);
    for (const CacheFormat format : {CacheFormat::gaac, CacheFormat::bf16}) {
      KvCache host(test::cache_config_for(r.sequences, format, &r.table, {0, 64}));
      const std::vector<SequenceId> ids = test::fill_cache(host, r.sequences);
      check_decompress(host, ids, r.sequences);
    }
  }
}

TEST_F(GpuCodec, DecompressAdversarialAndEveryPattern) {
  {
    std::vector<KvDump> seqs;
    for (int s = 0; s < 4; ++s) seqs.push_back(adversarial(2, 128, 16 * (s + 2) + s, 70 + static_cast<uint64_t>(s)));
    const CalibrationTable table = uniform_table(1, 2, 128, kCapacity);
    KvCache host(test::cache_config_for(seqs, CacheFormat::gaac, &table, {0}));
    const std::vector<SequenceId> ids = test::fill_cache(host, seqs);
    check_decompress(host, ids, seqs);
  }
  for (const int channels : {64, 128}) {
    auto [dump, table] = every_pattern(channels);
    const std::vector<KvDump> seqs = {dump};
    KvCache host(test::cache_config_for(seqs, CacheFormat::gaac, &table, {0}));
    const std::vector<SequenceId> ids = test::fill_cache(host, seqs);
    EXPECT_EQ(host.usage().raw_tiles, 0u) << "every pattern tile should be a slot";
    check_decompress(host, ids, seqs);
  }
}

// ---- snapshots ---------------------------------------------------------------------------------------

void check_snapshot(const KvDump& dump, const CalibrationTable& table) {
  const std::vector<uint8_t> cpu = gaac::snapshot_image(dump, table);
  const std::vector<uint8_t> gpu = cuda::snapshot_image(dump, table);
  ASSERT_EQ(gpu.size(), cpu.size());
  const auto diff = std::ranges::mismatch(gpu, cpu);
  ASSERT_TRUE(diff.in1 == gpu.end()) << "first difference at byte " << (diff.in1 - gpu.begin());
  const Snapshot back = parse_snapshot(gpu, "GPU image");
  for (size_t l = 0; l < dump.layers.size(); ++l) {
    EXPECT_EQ(back.dump.layers[l].k.data, dump.layers[l].k.data);
    EXPECT_EQ(back.dump.layers[l].v.data, dump.layers[l].v.data);
  }
}

TEST_F(GpuCodec, SnapshotImagesEqualHost) {
  for (const auto& [kv, hd] : {std::pair{8, 128}, {3, 64}, {1, 256}}) {
    for (const int tokens : {0, 1, 15, 16, 17, 1003}) {
      SCOPED_TRACE(testing::Message() << kv << " heads × d " << hd << ", " << tokens << " tokens");
      const Realistic r = realistic(2, kv, hd, {tokens}, 31);
      check_snapshot(r.sequences.front(), r.table);
    }
  }
  for (const int hd : {64, 128, 256}) {
    SCOPED_TRACE(testing::Message() << "adversarial d " << hd);
    check_snapshot(adversarial(3, hd, 16 * 11 + 5, 9), uniform_table(1, 3, hd, kCapacity));
  }
  for (const int channels : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "every pattern, " << channels << " channels");
    const auto [dump, table] = every_pattern(channels);
    check_snapshot(dump, table);
  }
}

// Bases at the ends of their ranges (b3 0 or 248, b4 0 or 240) and exponents near both windows' edges
// and everywhere: where an exponent below its base must not pass for a small offset.
TEST_F(GpuCodec, SnapshotExtremeBasesEqualHost) {
  for (const auto& [b3, b4] : {std::pair{0, 0}, {248, 240}, {248, 0}, {0, 240}, {7, 15}}) {
    for (const int hd : {64, 128}) {
      SCOPED_TRACE(testing::Message() << "b3 " << b3 << ", b4 " << b4 << ", d " << hd);
      std::mt19937_64 rng(static_cast<uint64_t>(b3 * 1000 + b4 + hd));
      KvDump d;
      KvLayer layer;
      for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
        KvTensor& t = layer.of(kind);
        t = {16 * 40 + 3, 2, hd, std::vector<uint16_t>(static_cast<size_t>(16 * 40 + 3) * 2 * hd)};
        for (size_t i = 0; i < t.data.size(); ++i) {
          const int near[] = {b3 - 1, b3, b3 + 7, b3 + 8, b4 - 1, b4, b4 + 15, b4 + 16, 0, 255};
          // Tiles of three kinds, by block: near the edges, uniform over 0..255, all in b3's window.
          const size_t block = i / (static_cast<size_t>(16) * 2 * hd);
          const int e = block % 3 == 0 ? near[rng() % 10] : block % 3 == 1 ? static_cast<int>(rng() % 256) : b3 + static_cast<int>(rng() % 8);
          t.data[i] = test::bf16_bits(static_cast<int>(rng() & 1), std::clamp(e, 0, 255), static_cast<int>(rng() % 128));
        }
      }
      d.layers.push_back(std::move(layer));
      check_snapshot(d, uniform_table(1, 2, hd, TileShape{TensorKind::key, hd}.max_slot_capacity(), b3, b4));
    }
  }
}

TEST_F(GpuCodec, AnAllocationTooLargeSaysWhatTheDeviceHasFree) {
  try {
    DeviceBuffer too_large(size_t{1} << 52);  // 4 PiB
    FAIL() << "a 4 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4503599627370496 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("free on the device"), std::string::npos) << e.what();
  }
  DeviceBuffer fine(1 << 20);  // the failure left no sticky error behind
  EXPECT_EQ(fine.bytes(), size_t{1} << 20);
}

TEST_F(GpuCodec, SmallCaseForTheSanitizers) {
  std::vector<KvDump> seqs = {adversarial(2, 128, 48, 1), adversarial(2, 128, 32, 2)};
  check_finalize(seqs, uniform_table(1, 2, 128, kCapacity));
  const CalibrationTable table = uniform_table(1, 2, 128, kCapacity);
  seqs.push_back(adversarial(2, 128, 21, 3));
  KvCache host(test::cache_config_for(seqs, CacheFormat::gaac, &table, {0}));
  const std::vector<SequenceId> ids = test::fill_cache(host, seqs);
  check_decompress(host, ids, seqs);
  check_snapshot(seqs.back(), table);
}

}  // namespace
}  // namespace gaac
