// The FP8 paged caches (gaac_fp8 and its plain fp8 twin, E4M3 and E5M2) against a dense reference:
// random operation sequences, every byte pattern and adversarial tiles (all raw, every NaN encoding,
// infinities, subnormals) appended and read back code for code, sliding windows, budgets and the
// errors of configurations and calls that do not fit an FP8 cache.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cache_model.hpp"
#include "gaac/batch_kv_cache.hpp"
#include "gaac/capacity.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"
#include "support/fp8_tile_data.hpp"

namespace gaac {
namespace {

using test::Model;
using Rows = test::Rows<uint8_t>;

constexpr ElementFormat kFormats[] = {ElementFormat::e4m3, ElementFormat::e5m2};
constexpr CacheFormat kCaches[] = {CacheFormat::gaac_fp8, CacheFormat::fp8};

std::string name(CacheFormat cache, ElementFormat element) { return std::string(to_string(cache)) + " " + to_string(element); }

TEST(Fp8KvCache, RandomOperationsMatchADenseReference) {
  for (const ElementFormat element : kFormats) {
    for (const int head_dim : {64, 128, 256}) {
      const Model setup(3, 2, head_dim, {0, 48, 0}, 512, element);
      int failures = 0;
      for (const CacheFormat format : kCaches) {
        SCOPED_TRACE(name(format, element) + " head_dim " + std::to_string(head_dim));
        test::run_random_operations<uint8_t>(setup, format, size_t{4} << 20, 11 + head_dim, 100, failures);
      }
    }
  }
}

TEST(Fp8KvCache, RandomOperationsUnderATightBudget) {
  for (const ElementFormat element : kFormats) {
    const Model setup(2, 1, 128, {32, 0}, 512, element);
    const KvCache sizing(setup.config(CacheFormat::gaac_fp8, size_t{8} << 20));
    const size_t block = sizing.geometry().entries_per_row() * 2 * sizing.geometry().unit_bytes;
    for (const CacheFormat format : kCaches) {
      SCOPED_TRACE(name(format, element));
      int failures = 0;
      test::run_random_operations<uint8_t>(setup, format, 12 * block, 79, 240, failures);
      EXPECT_GT(failures, 10);
    }
  }
}

/// One layer, one head of `channels`: a cache of `format` whose calibration has every base `b2`/`b3`
/// and the largest escape capacity, so that the tiles built below decide alone whether they compress.
struct Single {
  CalibrationTable table;
  CacheConfig config;

  Single(CacheFormat format, ElementFormat element, int channels, int b2, int b3) : table(1, 1, channels, element) {
    const size_t capacity = Fp8TileShape{element, {TensorKind::key, channels}}.max_slot_capacity();
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      std::fill(table.narrow(kind, 0, 0).begin(), table.narrow(kind, 0, 0).end(), static_cast<uint8_t>(b2));
      std::fill(table.wide(kind, 0, 0).begin(), table.wide(kind, 0, 0).end(), static_cast<uint8_t>(b3));
      table.set_escape_capacity(kind, 0, capacity);
    }
    config.geometry = {1, 1, channels, {}};
    config.format = format;
    config.budget_bytes = size_t{1} << 20;
    config.calibration = &table;
    config.fp8 = {element, {0.5f}, {2.0f}};
  }
};

/// Appends `codes` (`[tokens][channels]`) as K and the same with every sign flipped as V, in appends of
/// `step` tokens, and reads every position back; checks the usage against each complete block encoded
/// alone (compressed where its escapes fit, its slot's unused escape bytes) and returns it.
CacheUsage round_trip(const CacheConfig& config, const std::vector<uint8_t>& codes, int step) {
  const int channels = config.geometry.head_dim;
  const int tokens = static_cast<int>(codes.size()) / channels;
  std::vector<uint8_t> values(codes);
  for (uint8_t& x : values) x ^= 0x80;
  KvCache cache(config);
  const SequenceId id = cache.add_sequence();
  const auto view = [&](const std::vector<uint8_t>& data, int first, int count) {
    return Fp8KvView{data.data(), tokens, 1, channels, static_cast<size_t>(channels), static_cast<size_t>(channels)}.tokens_from(first, count);
  };
  for (int at = 0; at < tokens; at += step) {
    const int n = std::min(step, tokens - at);
    const Fp8KvView k[] = {view(codes, at, n)}, v[] = {view(values, at, n)};
    EXPECT_EQ(cache.append(id, k, v).status, CacheStatus::ok);
  }
  cache.check_invariants();
  const CacheUsage u = cache.usage();
  uint64_t compressed = 0, unused = 0;
  if (config.format == CacheFormat::gaac_fp8) {
    const size_t capacity = cache.geometry().escape_capacity();
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const Fp8TileShape shape{config.fp8.element, {kind, channels}};
      std::vector<uint8_t> slot(shape.slot_bytes(capacity));
      const std::vector<uint8_t>& data = kind == TensorKind::key ? codes : values;
      for (int b = 0; b < tokens / kTileTokens; ++b) {
        const TileEncoding e = encode_fp8_tile(shape, data.data() + static_cast<size_t>(b) * kTileTokens * channels, static_cast<size_t>(channels),
                                               config.calibration->fp8_tile_bases(kind, 0, 0, 0), capacity, slot);
        compressed += e.fits ? 1 : 0;
        unused += e.fits ? capacity - e.escape_bytes : 0;
      }
    }
  }
  EXPECT_EQ(u.compressed_tiles, compressed);
  EXPECT_EQ(u.unused_slot_bytes, unused);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    Fp8KvTensor got{tokens, 1, channels, std::vector<uint8_t>(codes.size(), 0xA5)};
    cache.read(id, 0, kind, 0, mutable_view_of(got));
    EXPECT_EQ(got.data, kind == TensorKind::key ? codes : values) << (kind == TensorKind::key ? "K" : "V");
  }
  return u;
}

TEST(Fp8KvCache, EveryBytePatternComesBackFromEveryKindOfTile) {
  for (const ElementFormat element : kFormats) {
    for (const int channels : {64, 128}) {
      // Tiles that compress with bases 0 (every pattern in every other group), then tiles of every
      // pattern at every channel (raw: their escapes do not fit), then an open block of them.
      test::Fp8TileCase tile = test::uniform_fp8_tile({element, {TensorKind::key, channels}}, 0, 0);
      test::fill_every_pattern(tile);
      std::vector<uint8_t> codes(tile.elements);
      codes.insert(codes.end(), tile.elements.begin(), tile.elements.end());
      for (int t = 0; t < 256 + 9; ++t) {
        for (int c = 0; c < channels; ++c) codes.push_back(static_cast<uint8_t>(t + c));
      }
      for (const CacheFormat format : kCaches) {
        SCOPED_TRACE(name(format, element) + " channels " + std::to_string(channels));
        const Single single(format, element, channels, 0, 0);
        for (const int step : {1, 5, 16, 1000}) {
          const CacheUsage u = round_trip(single.config, codes, step);
          EXPECT_EQ(u.element_bytes, 1u);
          EXPECT_EQ(u.tail_tiles, 2u);
          if (format == CacheFormat::gaac_fp8) {
            EXPECT_GE(u.compressed_tiles, 2u * 2);  // at least the two calm blocks, K and V
          } else {
            EXPECT_EQ(u.compressed_tiles, 0u);
          }
        }
      }
    }
  }
}

/// Every byte of `format` that is not a finite number: NaNs (E4M3 S.1111.111; E5M2 exponent 31,
/// mantissa not 0) and E5M2's infinities.
std::vector<uint8_t> specials(ElementFormat format) {
  std::vector<uint8_t> out;
  for (int x = 0; x < 256; ++x) {
    if (!std::isfinite(fp8_to_float(static_cast<uint8_t>(x), format))) out.push_back(static_cast<uint8_t>(x));
  }
  return out;
}

TEST(Fp8KvCache, AdversarialTilesComeBackCodeForCode) {
  for (const ElementFormat element : kFormats) {
    const std::vector<uint8_t> nans = specials(element);
    ASSERT_EQ(nans.size(), element == ElementFormat::e4m3 ? 2u : 8u);  // E5M2: 6 NaNs and ±Inf
    const int m = mantissa_bits(element), top = (1 << exponent_bits(element)) - 1;
    for (const int channels : {64, 128}) {
      const size_t n = static_cast<size_t>(kTileTokens) * channels;
      std::mt19937_64 rng(static_cast<uint64_t>(channels) + static_cast<uint64_t>(element));
      std::vector<uint8_t> nan_tile(n), subnormal_tile(n), random_tile(n), zero_tile(n, 0), top_tile(n);
      for (size_t i = 0; i < n; ++i) {
        nan_tile[i] = nans[i % nans.size()];
        subnormal_tile[i] = static_cast<uint8_t>((i & 1) << 7 | (1 + i % ((1u << m) - 1)));  // exponent 0, mantissa ≠ 0
        random_tile[i] = static_cast<uint8_t>(rng());
        top_tile[i] = test::fp8_bits(element, static_cast<int>(i % 2), top - static_cast<int>(i % 4), static_cast<int>(i % 3));
      }
      // Bases at the bottom (subnormals and zeros compress, NaNs stay raw) and at the top of the
      // exponent range (NaNs and infinities compress, the rest stays raw).
      for (const bool high : {false, true}) {
        const int b2 = high ? fp8_max_base2(element) : 0, b3 = high ? fp8_max_base3(element) : 0;
        for (const CacheFormat format : kCaches) {
          SCOPED_TRACE(name(format, element) + " channels " + std::to_string(channels) + (high ? " high bases" : " low bases"));
          const Single single(format, element, channels, b2, b3);
          std::vector<uint8_t> codes;
          for (const auto* t : {&nan_tile, &subnormal_tile, &random_tile, &zero_tile, &top_tile, &nan_tile}) codes.insert(codes.end(), t->begin(), t->end());
          codes.insert(codes.end(), nan_tile.begin(), nan_tile.begin() + 7 * channels);  // an open block of NaNs
          const CacheUsage u = round_trip(single.config, codes, 16);
          EXPECT_EQ(u.compressed_tiles + u.raw_tiles, 6u * 2);
          if (format == CacheFormat::gaac_fp8) {
            EXPECT_EQ(u.compressed_tiles, high ? 3u * 2 : 2u * 2);  // high: NaN, NaN, top; low: subnormal, zero
          } else {
            EXPECT_EQ(u.compressed_tiles, 0u);
          }
        }
      }
      // Random bytes everywhere: every tile of a gaac-fp8 cache with calibrated bases stays raw.
      const Single single(CacheFormat::gaac_fp8, element, channels, 0, 0);
      std::vector<uint8_t> codes;
      for (int b = 0; b < 5; ++b) {
        for (size_t i = 0; i < n; ++i) codes.push_back(static_cast<uint8_t>(rng()));
      }
      const CacheUsage u = round_trip(single.config, codes, 3);
      EXPECT_EQ(u.compressed_tiles, 0u);
      EXPECT_EQ(u.raw_tiles, 5u * 2);
      EXPECT_EQ(u.raw_bytes(), 5u * 2 * 2 * u.unit_bytes);
    }
  }
}

TEST(Fp8KvCache, UnitsAreFp8SlotsOrRawFp8Tiles) {
  for (const ElementFormat element : kFormats) {
    const Model setup(2, 2, 128, {}, 64, element);
    const KvCache compressed(setup.config(CacheFormat::gaac_fp8, size_t{1} << 20));
    const KvCache plain(setup.config(CacheFormat::fp8, size_t{1} << 20));
    const Fp8TileShape shape{element, {TensorKind::key, 128}};
    size_t capacity = 0;
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (int l = 0; l < 2; ++l) capacity = std::max(capacity, setup.fp8_table.escape_capacity(kind, l));
    }
    EXPECT_EQ(compressed.geometry().unit_bytes, shape.slot_bytes(capacity));
    EXPECT_EQ(compressed.geometry().escape_capacity(), capacity);
    EXPECT_TRUE(compressed.geometry().raw_split());
    EXPECT_EQ(compressed.geometry().element_format, element);
    EXPECT_NE(compressed.fp8_codecs(), nullptr);
    EXPECT_EQ(compressed.codecs(), nullptr);
    EXPECT_EQ(plain.geometry().unit_bytes, 16u * 128);
    EXPECT_FALSE(plain.geometry().raw_split());
    EXPECT_EQ(plain.geometry().element_format, element);
    EXPECT_EQ(plain.fp8_codecs(), nullptr);
    EXPECT_NE(compressed.view().bases, nullptr);
    EXPECT_EQ(plain.view().bases, nullptr);
    EXPECT_EQ(compressed.scale(1, TensorKind::value), setup.fp8_source.v_scales[1]);
    EXPECT_EQ(plain.scale(0, TensorKind::key), setup.fp8_source.k_scales[0]);
    // The same tokens: the compressed cache holds them in fewer bytes, the dense size is one byte each.
    KvCache a(setup.config(CacheFormat::gaac_fp8, size_t{1} << 20)), b(setup.config(CacheFormat::fp8, size_t{1} << 20));
    std::mt19937_64 rng(2);
    const Rows rows(setup, 64, 0, rng, 0.0);
    for (KvCache* c : {&a, &b}) ASSERT_EQ(c->append(c->add_sequence(), rows.kv, rows.vv).status, CacheStatus::ok);
    EXPECT_EQ(a.usage().elements, 64u * 2 * 2 * 2 * 128);
    EXPECT_EQ(a.usage().dense_bytes(), a.usage().elements);
    EXPECT_EQ(b.usage().unit_bytes_used(), b.usage().dense_bytes());
    EXPECT_LT(a.usage().unit_bytes_used(), b.usage().unit_bytes_used());
    EXPECT_GT(a.usage().compressed_tiles, 0u);
  }
}

TEST(Fp8KvCache, SlidingLayersReleaseOldBlocks) {
  const Model setup(2, 2, 64, {32, 32}, 512, ElementFormat::e5m2);
  for (const CacheFormat format : kCaches) test::expect_sliding_layers_release<uint8_t>(setup, format, 0.01);
}

TEST(Fp8KvCache, BudgetsHoldWhatTheySay) {
  const Model setup(2, 2, 64, {}, 512, ElementFormat::e4m3);
  for (const CacheFormat format : kCaches) {
    SCOPED_TRACE(to_string(format));
    const CalibrationTable* table = &setup.fp8_table;
    // The worst case holds 100 tokens of random bytes (every tile raw); one unit's bytes less does not.
    const uint64_t worst = worst_case_budget(setup.geometry, format, table, 100);
    std::mt19937_64 rng(5);
    const Rows noise(setup, 100, 0, rng, 1.0);
    KvCache cache(setup.config(format, worst));
    const SequenceId id = cache.add_sequence();
    ASSERT_EQ(cache.append(id, noise.kv, noise.vv).status, CacheStatus::ok);
    EXPECT_EQ(cache.usage().units_free, 0u);
    KvCache small(setup.config(format, worst - cache.geometry().unit_bytes));
    const AppendOutcome refused = small.append(small.add_sequence(), noise.kv, noise.vv);
    ASSERT_EQ(refused.status, CacheStatus::out_of_space);
    EXPECT_TRUE(refused.measured);
    EXPECT_EQ(refused.budget_needed, worst);
    EXPECT_EQ(small.usage().units_free, small.usage().units);  // nothing changed
    small.check_invariants();
    // Calm rows: the budget a refusal names takes them exactly.
    const Rows calm(setup, 100, 0, rng, 0.0);
    const uint64_t least = least_budget(setup.geometry, format, table, std::vector<int>{100});
    KvCache tight(setup.config(format, least));
    const AppendOutcome r = tight.append(tight.add_sequence(), calm.kv, calm.vv);
    if (r.status != CacheStatus::ok) {
      KvCache enough(setup.config(format, r.budget_needed));
      EXPECT_EQ(enough.append(enough.add_sequence(), calm.kv, calm.vv).status, CacheStatus::ok);
      KvCache short_of(setup.config(format, r.budget_needed - 1));
      EXPECT_EQ(short_of.append(short_of.add_sequence(), calm.kv, calm.vv).status, CacheStatus::out_of_space);
    }
    EXPECT_EQ(format == CacheFormat::fp8, least == worst);  // a plain cache's need is exact
  }
}

TEST(Fp8KvCache, CapacityOfAPlainCacheIsExactAndGaacFp8HoldsMore) {
  const Model setup(2, 2, 64, {0, 32}, 512, ElementFormat::e5m2);
  const uint64_t budget = uint64_t{3} << 20;
  const int tokens = 160;  // complete blocks: an open one is raw, two units in a gaac-fp8 cache
  const CapacityEstimate plain = estimate_capacity(setup.geometry, CacheFormat::fp8, nullptr, budget, tokens);
  const CapacityEstimate compressed = estimate_capacity(setup.geometry, CacheFormat::gaac_fp8, &setup.fp8_table, budget, tokens);
  EXPECT_GT(compressed.max_sequences, plain.max_sequences);
  EXPECT_GT(compressed.max_tokens, plain.max_tokens);
  // A plain cache of that budget holds exactly the estimated sequences, whatever their codes.
  KvCache cache(setup.config(CacheFormat::fp8, budget));
  std::mt19937_64 rng(6);
  const Rows rows(setup, tokens, 0, rng, 1.0);
  int64_t held = 0;
  while (cache.append(cache.add_sequence(), rows.kv, rows.vv).status == CacheStatus::ok) ++held;
  EXPECT_EQ(held, plain.max_sequences);
  EXPECT_THROW(measure_capacity(setup.geometry, CacheFormat::fp8, nullptr, budget, tokens, setup.source), Error);
}

TEST(Fp8KvCache, RejectsConfigurationsAndCallsThatDoNotFit) {
  const Model setup(2, 2, 64, {}, 64, ElementFormat::e4m3);
  const auto throws = [&](CacheConfig c, const char* why) { EXPECT_THROW(KvCache{c}, Error) << why; };
  CacheConfig c = setup.config(CacheFormat::gaac_fp8, size_t{1} << 20);
  c.calibration = nullptr;
  throws(c, "no calibration");
  c = setup.config(CacheFormat::gaac_fp8, size_t{1} << 20);
  c.calibration = &setup.table;
  throws(c, "a BF16 calibration for an FP8 cache");
  c = setup.config(CacheFormat::gaac, size_t{1} << 20);
  c.calibration = &setup.fp8_table;
  throws(c, "an FP8 calibration for a BF16 cache");
  c = setup.config(CacheFormat::gaac_fp8, size_t{1} << 20);
  c.fp8.element = ElementFormat::e5m2;
  throws(c, "an E5M2 cache with an E4M3 calibration");
  for (const CacheFormat format : kCaches) {
    c = setup.config(format, size_t{1} << 20);
    c.fp8.element = ElementFormat::bf16;
    throws(c, "BF16 elements");
    c = setup.config(format, size_t{1} << 20);
    c.fp8.k_scales.clear();
    throws(c, "no K scales");
    c = setup.config(format, size_t{1} << 20);
    c.fp8.v_scales.pop_back();
    throws(c, "a V scale missing");
    for (const float bad : {0.0f, -1.0f, NAN, INFINITY}) {
      c = setup.config(format, size_t{1} << 20);
      c.fp8.v_scales[1] = bad;
      throws(c, "a bad scale");
    }
  }
  EXPECT_THROW(worst_case_budget(setup.geometry, CacheFormat::gaac_fp8, nullptr, 10), Error);
  EXPECT_NO_THROW(worst_case_budget(setup.geometry, CacheFormat::fp8, nullptr, 10));  // needs no calibration
  // Calls with the other element type, a dump and attention are refused.
  KvCache fp8(setup.config(CacheFormat::gaac_fp8, size_t{1} << 20)), bf16(setup.config(CacheFormat::gaac, size_t{1} << 20));
  std::mt19937_64 rng(1);
  const test::Rows<uint16_t> bf16_rows(setup, 3, 0, rng, 0.0);
  const Rows fp8_rows(setup, 3, 0, rng, 0.0);
  const SequenceId a = fp8.add_sequence(), b = bf16.add_sequence();
  EXPECT_THROW(fp8.append(a, bf16_rows.kv, bf16_rows.vv), Error);
  EXPECT_THROW(bf16.append(b, fp8_rows.kv, fp8_rows.vv), Error);
  ASSERT_EQ(fp8.append(a, fp8_rows.kv, fp8_rows.vv).status, CacheStatus::ok);
  KvTensor wide{3, 2, 64, std::vector<uint16_t>(3 * 2 * 64)};
  EXPECT_THROW(fp8.read(a, 0, TensorKind::key, 0, mutable_view_of(wide)), Error);
  EXPECT_THROW(fp8.dump(a), Error);
  Fp8KvTensor narrow{3, 2, 64, std::vector<uint8_t>(3 * 2 * 64)};
  EXPECT_THROW(bf16.read(b, 0, TensorKind::key, 0, mutable_view_of(narrow)), Error);
  BatchCacheConfig batch;
  batch.cache = setup.config(CacheFormat::fp8, size_t{1} << 20);
  EXPECT_THROW(make_host_batch_kv_cache(batch), Error);
}

}  // namespace
}  // namespace gaac
