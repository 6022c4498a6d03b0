// Compression statistics: every figure of gaac::measure checked against an independent
// recomputation or an exact hand-derived value.
#include "gaac/stats.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

using test::bf16_bits;

constexpr TensorKind kKinds[] = {TensorKind::key, TensorKind::value};

const KvTensor& tensor(const KvLayer& l, TensorKind kind) { return kind == TensorKind::key ? l.k : l.v; }
const TensorStats& stats_of(const LayerStats& l, TensorKind kind) { return kind == TensorKind::key ? l.k : l.v; }

CalibrationTable calibrated(const KvDump& dump) {
  const KvDump* dumps[] = {&dump};
  return calibrate(dumps);
}

/// What a test computes on its own for one tensor, without the tiling helpers of the library.
struct Expected {
  uint64_t tiles = 0, fallback = 0, tail = 0, escape = 0, codec = 0, resident = 0;
  std::array<uint64_t, 3> groups{};
  std::vector<uint32_t> tile_escapes;  ///< escape bytes of each tile
};

Expected recompute(const KvTensor& t, TensorKind kind, int layer, const CalibrationTable& table) {
  Expected e;
  const int width = std::min(t.head_dim, 128);
  const TileShape shape{kind, width};
  const size_t capacity = table.escape_capacity(kind, layer);
  std::vector<uint16_t> tile(static_cast<size_t>(16 * width));
  std::vector<uint8_t> slot(shape.slot_bytes(shape.max_slot_capacity()));
  const int blocks = t.tokens / 16;
  for (int b = 0; b < blocks; ++b) {
    for (int h = 0; h < t.kv_heads; ++h) {
      for (int half = 0; half < t.head_dim / width; ++half) {
        for (int r = 0; r < 16; ++r) {
          for (int c = 0; c < width; ++c) tile[static_cast<size_t>(r * width + c)] = t.at(16 * b + r, h, half * width + c);
        }
        const auto b3 = table.b3(kind, layer, h).subspan(static_cast<size_t>(half * width), static_cast<size_t>(width));
        const auto b4 = table.b4(kind, layer, h).subspan(static_cast<size_t>(half * width), static_cast<size_t>(width));
        const TileEncoding enc = encode_tile(shape, tile.data(), static_cast<size_t>(width), {b3, b4},
                                             shape.max_slot_capacity(), slot, Backend::scalar);
        ++e.tiles;
        for (size_t m = 0; m < 3; ++m) e.groups[m] += enc.groups_by_mode[m];
        e.escape += enc.escape_bytes;
        e.tile_escapes.push_back(enc.escape_bytes);
        e.codec += shape.fixed_bytes() + enc.escape_bytes;
        const bool fits = enc.escape_bytes <= capacity;
        if (!fits) ++e.fallback;
        e.resident += (fits ? shape.fixed_bytes() + capacity : 32u * static_cast<uint64_t>(width)) + 4;
      }
    }
  }
  e.tail = static_cast<uint64_t>(t.tokens % 16) * t.kv_heads * t.head_dim;
  e.codec += 2 * e.tail;
  e.resident += 2 * e.tail;
  return e;
}

void expect_matches(const TensorStats& s, const Expected& e, const KvTensor& t) {
  EXPECT_EQ(s.elements, t.elements());
  EXPECT_EQ(s.tiles, e.tiles);
  EXPECT_EQ(s.fallback_tiles, e.fallback);
  EXPECT_EQ(s.tail_elements, e.tail);
  EXPECT_EQ(s.groups, e.groups);
  EXPECT_EQ(s.escape_bytes, e.escape);
  EXPECT_EQ(s.codec_bytes, e.codec);
  EXPECT_EQ(s.resident_bytes, e.resident);
  EXPECT_EQ(s.bf16_bytes(), 2 * t.elements());
  uint64_t histogram_total = 0;
  for (const uint64_t c : s.exponents) histogram_total += c;
  EXPECT_EQ(histogram_total, t.elements());
}

TEST(Stats, SyntheticDumpMatchesAnIndependentRecomputation) {
  for (const int head_dim : {64, 128, 256}) {
    SCOPED_TRACE(head_dim);
    // 100 tokens: 6 blocks and a 4-token tail.
    const KvDump dump = make_synthetic_kv({.layers = 3, .kv_heads = 2, .head_dim = head_dim, .tokens = 100, .seed = 9});
    CalibrationTable table = calibrated(dump);
    // Make layer 1 tight so that some tiles fall back to raw and others do not: the capacity is the
    // median escape size rounded up to a multiple of 16.
    for (const TensorKind kind : kKinds) {
      std::vector<uint32_t> sizes = recompute(tensor(dump.layers[1], kind), kind, 1, table).tile_escapes;
      std::sort(sizes.begin(), sizes.end());
      const size_t median = sizes[sizes.size() / 2];
      table.set_escape_capacity(kind, 1, (median + 15) / 16 * 16);
    }
    int progress_calls = 0;
    const DumpStats stats = measure(dump, table, [&](size_t done, size_t total) {
      ++progress_calls;
      EXPECT_EQ(total, 3u);
      EXPECT_EQ(done, static_cast<size_t>(progress_calls));
    });
    EXPECT_EQ(progress_calls, 3);
    ASSERT_EQ(stats.layers.size(), 3u);

    Expected sum;
    for (int l = 0; l < 3; ++l) {
      for (const TensorKind kind : kKinds) {
        SCOPED_TRACE(testing::Message() << "layer " << l << (kind == TensorKind::key ? " K" : " V"));
        const KvTensor& t = tensor(dump.layers[static_cast<size_t>(l)], kind);
        const Expected e = recompute(t, kind, l, table);
        const TensorStats& s = stats_of(stats.layers[static_cast<size_t>(l)], kind);
        expect_matches(s, e, t);
        sum.codec += e.codec;
        sum.resident += e.resident;
        sum.fallback += e.fallback;
        if (l == 1) {
          EXPECT_GT(e.fallback, 0u);  // the tight capacity forces fallbacks...
          EXPECT_LT(e.fallback, e.tiles);  // ...but not everywhere
        }
        // Mode fractions are a partition of the groups.
        double fractions = 0;
        for (const GroupMode m : {GroupMode::bits3, GroupMode::bits4, GroupMode::raw}) fractions += s.mode_fraction(m);
        EXPECT_NEAR(fractions, 1.0, 1e-12);
        EXPECT_GT(s.mode_fraction(GroupMode::bits3), 0.0);
        EXPECT_GT(s.mode_fraction(GroupMode::bits4), 0.0);
      }
    }
    EXPECT_EQ(stats.total.codec_bytes, sum.codec);
    EXPECT_EQ(stats.total.resident_bytes, sum.resident + table.bases_bytes());
    EXPECT_EQ(table.bases_bytes(), 4u * 3 * 2 * static_cast<uint64_t>(head_dim));
    EXPECT_EQ(stats.total.fallback_tiles, sum.fallback);
    EXPECT_EQ(stats.k_total.codec_bytes + stats.v_total.codec_bytes, stats.total.codec_bytes);
    EXPECT_EQ(stats.k_total.resident_bytes + stats.v_total.resident_bytes + table.bases_bytes(),
              stats.total.resident_bytes);
    EXPECT_EQ(stats.total.elements, dump.bf16_bytes() / 2);
    double fractions = 0;
    for (const GroupMode m : {GroupMode::bits3, GroupMode::bits4, GroupMode::raw}) fractions += stats.total.mode_fraction(m);
    EXPECT_NEAR(fractions, 1.0, 1e-12);
    EXPECT_DOUBLE_EQ(stats.total.ratio(),
                     static_cast<double>(stats.total.bf16_bytes()) / static_cast<double>(stats.total.codec_bytes));
    EXPECT_DOUBLE_EQ(stats.total.bits_per_element(),
                     8.0 * static_cast<double>(stats.total.codec_bytes) / static_cast<double>(stats.total.elements));
    EXPECT_GT(stats.total.ratio(), 1.0);
  }
}

/// A dump whose channel c of token t has exponent 100 + (t + c) mod 8: every channel sees the eight
/// exponents 100..107, so calibration picks b3 = 100 and every group is 3-bit.
KvDump three_bit_dump(int layers, int heads, int head_dim, int tokens) {
  KvDump dump;
  for (int l = 0; l < layers; ++l) {
    KvLayer layer;
    for (KvTensor* t : {&layer.k, &layer.v}) {
      *t = KvTensor{tokens, heads, head_dim, {}};
      t->data.resize(t->elements());
      for (int token = 0; token < tokens; ++token) {
        for (int i = 0; i < heads * head_dim; ++i) {
          t->data[static_cast<size_t>(token) * heads * head_dim + i] =
              bf16_bits(i & 1, 100 + (token + i) % 8, (token * 31 + i) & 0x7F);
        }
      }
    }
    dump.layers.push_back(std::move(layer));
  }
  return dump;
}

TEST(Stats, AllThreeBitDumpCompressesBy16Over11Point25Exactly) {
  for (const int head_dim : {64, 128, 256}) {
    SCOPED_TRACE(head_dim);
    const KvDump dump = three_bit_dump(2, 2, head_dim, 48);
    const CalibrationTable table = calibrated(dump);
    ASSERT_EQ(table.b3(TensorKind::key, 0, 0)[0], 100);
    ASSERT_EQ(table.escape_capacity(TensorKind::key, 0), 0u);
    const DumpStats stats = measure(dump, table);
    const TileShape shape = tile_shape_for(TensorKind::key, head_dim);
    const uint64_t tiles = 2u * 3 * 2 * static_cast<uint64_t>(head_dim / shape.channels) * 2;  // layers·blocks·heads·halves·(K,V)
    EXPECT_EQ(stats.total.tiles, tiles);
    EXPECT_EQ(stats.total.tail_elements, 0u);
    EXPECT_EQ(stats.total.escape_bytes, 0u);
    EXPECT_EQ(stats.total.fallback_tiles, 0u);
    EXPECT_EQ(stats.total.mode_fraction(GroupMode::bits3), 1.0);
    EXPECT_EQ(stats.total.mode_fraction(GroupMode::raw), 0.0);
    EXPECT_EQ(stats.total.codec_bytes, tiles * shape.slot_bytes(0));
    EXPECT_EQ(stats.total.ratio(), 16.0 / 11.25);
    EXPECT_EQ(stats.total.bits_per_element(), 11.25);
    EXPECT_EQ(stats.total.resident_bytes, tiles * (shape.slot_bytes(0) + kBlockTableEntryBytes) + table.bases_bytes());
    for (const LayerStats& l : stats.layers) {
      EXPECT_EQ(l.k.ratio(), 16.0 / 11.25);
      EXPECT_EQ(l.v.ratio(), 16.0 / 11.25);
      EXPECT_EQ(l.k.resident_bytes, l.k.tiles * (shape.slot_bytes(0) + kBlockTableEntryBytes));
    }
  }
}

TEST(Stats, TailTokensAreCountedRaw) {
  // 53 tokens = 3 blocks and 5 tail tokens; the blocks are all-3-bit as above.
  const int heads = 2, head_dim = 128, tokens = 53;
  const KvDump dump = three_bit_dump(1, heads, head_dim, tokens);
  const CalibrationTable table = calibrated(dump);
  ASSERT_EQ(table.b3(TensorKind::value, 0, 1)[7], 100);
  const DumpStats stats = measure(dump, table);
  const TileShape shape = tile_shape_for(TensorKind::key, head_dim);
  for (const TensorKind kind : kKinds) {
    const TensorStats& s = stats_of(stats.layers[0], kind);
    const uint64_t tail = 5u * heads * head_dim;
    EXPECT_EQ(s.tiles, 3u * heads);
    EXPECT_EQ(s.tail_elements, tail);
    EXPECT_EQ(s.codec_bytes, s.tiles * shape.slot_bytes(0) + 2 * tail);
    EXPECT_EQ(s.resident_bytes, s.tiles * (shape.slot_bytes(0) + kBlockTableEntryBytes) + 2 * tail);
    // The tail lowers the ratio below 16/11.25, exactly as much as its raw bytes weigh.
    EXPECT_LT(s.ratio(), 16.0 / 11.25);
    EXPECT_DOUBLE_EQ(s.ratio(), static_cast<double>(2u * tokens * heads * head_dim) /
                                    static_cast<double>(s.tiles * shape.slot_bytes(0) + 2 * tail));
    // Tail elements still count in the exponent histogram (all elements do)...
    EXPECT_EQ(s.exponents[100] + s.exponents[101] + s.exponents[102] + s.exponents[103] + s.exponents[104] +
                  s.exponents[105] + s.exponents[106] + s.exponents[107],
              static_cast<uint64_t>(tokens) * heads * head_dim);
    // ...but not in the groups, which belong to complete tiles only.
    EXPECT_EQ(s.groups[0], s.tiles * static_cast<uint64_t>(shape.groups()));
  }
}

TEST(Stats, FewerThanSixteenTokensIsAllRaw) {
  const KvDump dump = three_bit_dump(2, 1, 64, 7);
  const DumpStats stats = measure(dump, calibrated(dump));
  EXPECT_EQ(stats.total.tiles, 0u);
  EXPECT_EQ(stats.total.codec_bytes, stats.total.bf16_bytes());
  EXPECT_EQ(stats.total.ratio(), 1.0);
  EXPECT_EQ(stats.total.mode_fraction(GroupMode::bits3), 0.0);  // no groups: 0, not NaN
  EXPECT_EQ(stats.k_total.resident_bytes, stats.k_total.bf16_bytes());
}

TEST(Stats, ZeroTokenLayersGiveZerosNotNaN) {
  const KvDump dump = three_bit_dump(1, 1, 64, 0);
  const DumpStats stats = measure(dump, CalibrationTable(1, 1, 64));
  EXPECT_EQ(stats.total.elements, 0u);
  EXPECT_EQ(stats.total.codec_bytes, 0u);
  EXPECT_EQ(stats.total.ratio(), 0.0);
  EXPECT_EQ(stats.total.bits_per_element(), 0.0);
  EXPECT_EQ(stats.total.exponent_entropy_bits(), 0.0);
  EXPECT_EQ(stats.total.resident_bytes, CalibrationTable(1, 1, 64).bases_bytes());
}

TEST(Stats, ExponentEntropy) {
  // 48 tokens × 64 channels with exponent 100 + (t + c) mod 8: each of 8 values equally often.
  const KvDump uniform8 = three_bit_dump(1, 1, 64, 48);
  const DumpStats stats = measure(uniform8, calibrated(uniform8));
  EXPECT_DOUBLE_EQ(stats.total.exponent_entropy_bits(), 3.0);
  EXPECT_DOUBLE_EQ(stats.layers[0].k.exponent_entropy_bits(), 3.0);

  // Two values, one three times as often as the other: H = 2 − ¾·log2 3.
  KvDump skewed = uniform8;
  for (KvTensor* t : {&skewed.layers[0].k, &skewed.layers[0].v}) {
    for (size_t i = 0; i < t->data.size(); ++i) t->data[i] = bf16_bits(0, i % 4 == 0 ? 90 : 91, 1);
  }
  const DumpStats s2 = measure(skewed, calibrated(skewed));
  EXPECT_NEAR(s2.total.exponent_entropy_bits(), 2.0 - 0.75 * std::log2(3.0), 1e-12);

  // One value: no information.
  KvDump constant = uniform8;
  for (KvTensor* t : {&constant.layers[0].k, &constant.layers[0].v}) {
    for (auto& x : t->data) x = bf16_bits(1, 120, 5);
  }
  EXPECT_EQ(measure(constant, calibrated(constant)).total.exponent_entropy_bits(), 0.0);

  // One token, 64 channels with 64 different exponents, each seen once: 6 bits.
  KvDump distinct = three_bit_dump(1, 1, 64, 1);
  for (KvTensor* t : {&distinct.layers[0].k, &distinct.layers[0].v}) {
    for (size_t i = 0; i < t->data.size(); ++i) t->data[i] = bf16_bits(0, 60 + static_cast<int>(i), 0);
  }
  const DumpStats s3 = measure(distinct, CalibrationTable(1, 1, 64));
  EXPECT_DOUBLE_EQ(s3.layers[0].k.exponent_entropy_bits(), 6.0);
  EXPECT_DOUBLE_EQ(s3.total.exponent_entropy_bits(), 6.0);
}

TEST(Stats, MismatchedTableIsRejected) {
  const KvDump dump = three_bit_dump(2, 1, 64, 16);
  EXPECT_THROW(measure(dump, CalibrationTable(3, 1, 64)), Error);
  EXPECT_THROW(measure(dump, CalibrationTable(2, 2, 64)), Error);
  EXPECT_THROW(measure(dump, CalibrationTable(2, 1, 128)), Error);
  KvDump broken = dump;
  broken.layers[1].v.data.pop_back();
  EXPECT_THROW(measure(broken, CalibrationTable(2, 1, 64)), Error);
}

}  // namespace
}  // namespace gaac
