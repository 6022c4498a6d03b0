// The attention kernels one block at a time: over compressed slots, the AVX2 fused kernels (and the
// AVX-512 ones where the CPU has them) and the scalar ones give the same bits as the raw kernels
// (AVX2 and scalar) over the same tiles decoded first. Tiles of every mode mix, a raw group at every group position (every lane, every place in
// its row of 16), escape slots filled to the largest capacity with raw groups, BF16 specials (zeros,
// subnormals, infinities, NaNs), tile codecs of both backends, head widths 64, 128 and 256, every
// token range [first, end) of a block, one to five query heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/tile_kernels.hpp"
#include "common/cpu.hpp"
#include "gaac/bf16.hpp"
#include "gaac/tile_codec.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

using attention::BlockTask;
using attention::Kernels;
using attention::TileSource;

/// A tile whose group g is coded in modes[g] (the encoder picks exactly that mode), bases of
/// random_tile's kind. Raw groups take exponents up to 60 away from the 4-bit window (finite values
/// whose products and sums stay finite), or with `specials` anywhere, 0 and 255 (zeros, subnormals,
/// infinities, NaNs) in every raw group.
test::TileCase tile_with_modes(TileShape shape, const std::vector<GroupMode>& modes, std::mt19937_64& rng, bool specials) {
  test::TileCase tile = test::random_tile(shape, rng, 1.0, 0.0);  // every element in its 3-bit window
  const auto set_exponent = [&](const ElementSlot& at, int e) {
    uint16_t& x = tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel];
    x = static_cast<uint16_t>((x & 0x807F) | (e << 7));
  };
  for (int g = 0; g < shape.groups(); ++g) {
    const int lane = g / shape.groups_per_lane(), pair = g % shape.groups_per_lane();
    const int forced = static_cast<int>(rng() % kGroupSize);  // the element that decides the mode
    for (int i = 0; i < kGroupSize; ++i) {
      const ElementSlot at = element_slot(shape, lane, 2 * pair + i / kQuadSize, i % kQuadSize);
      const int b3 = tile.b3[at.channel], b4 = tile.b4[at.channel];  // b4 = b3 - 4
      const GroupMode mode = modes[static_cast<size_t>(g)];
      if (mode == GroupMode::bits4) {
        // In the 4-bit window; the forced one outside the 3-bit window.
        set_exponent(at, i == forced ? b3 + 8 + static_cast<int>(rng() % 4) : b4 + static_cast<int>(rng() % 16));
      } else if (mode == GroupMode::raw && specials) {
        const int e = rng() % 3 == 0 ? (rng() % 2 ? 0 : 255) : static_cast<int>(rng() % 256);
        set_exponent(at, i == forced ? (rng() % 2 ? 0 : 255) : e);
      } else if (mode == GroupMode::raw) {
        const int outside = rng() % 2 ? b4 - 1 - static_cast<int>(rng() % 60) : b4 + 16 + static_cast<int>(rng() % 60);
        set_exponent(at, i == forced ? outside : b4 - 60 + static_cast<int>(rng() % 136));
      }
    }
  }
  return tile;
}

/// Modes drawn with the given shares of 4-bit and raw groups.
std::vector<GroupMode> random_modes(TileShape shape, std::mt19937_64& rng, double p4, double praw) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<GroupMode> modes(static_cast<size_t>(shape.groups()));
  for (GroupMode& m : modes) {
    const double r = u(rng);
    m = r < praw ? GroupMode::raw : r < praw + p4 ? GroupMode::bits4 : GroupMode::bits3;
  }
  return modes;
}

/// Escapes filling `capacity` exactly: as many raw groups as fit, 4-bit groups for the rest, at
/// random places.
std::vector<GroupMode> full_slot_modes(TileShape shape, size_t capacity, std::mt19937_64& rng) {
  std::vector<GroupMode> modes(static_cast<size_t>(shape.groups()), GroupMode::bits3);
  const size_t raw = capacity / 5, four = capacity % 5;
  for (size_t i = 0; i < raw + four; ++i) modes[i] = i < raw ? GroupMode::raw : GroupMode::bits4;
  std::shuffle(modes.begin(), modes.end(), rng);
  return modes;
}

/// One head's tiles of one kind, coded (every half compressed) and decoded again.
struct CodedHead {
  std::vector<std::unique_ptr<TileCodec>> codecs;
  std::vector<std::vector<uint8_t>> slots;      // exactly slot_bytes() each, so overreads show
  std::vector<std::vector<uint16_t>> decoded;   // rows of each half, 16 × channels
  TileSource compressed[2], raw[2];
  int halves = 1, channels = 128;

  CodedHead(TensorKind kind, int head_dim, const std::vector<std::vector<GroupMode>>& modes, Backend backend, size_t capacity,
            std::mt19937_64& rng, bool specials) {
    channels = head_dim == 64 ? 64 : 128;
    halves = head_dim / channels;
    const TileShape shape{kind, channels};
    for (int h = 0; h < halves; ++h) {
      const test::TileCase tile = tile_with_modes(shape, modes[static_cast<size_t>(h)], rng, specials);
      codecs.push_back(std::make_unique<TileCodec>(shape, tile.bases(), capacity, backend));
      slots.emplace_back(codecs.back()->slot_bytes());
      TileEncoding e;
      codecs.back()->encode_blocks(tile.elements.data(), static_cast<size_t>(channels), 0, 1, slots.back().data(), 0, &e);
      EXPECT_TRUE(e.fits);
      for (int m = 0; m < 3; ++m) {
        const auto want = static_cast<uint32_t>(std::count(modes[static_cast<size_t>(h)].begin(), modes[static_cast<size_t>(h)].end(), static_cast<GroupMode>(m)));
        EXPECT_EQ(e.groups_by_mode[static_cast<size_t>(m)], want) << "mode " << m;
      }
      decoded.emplace_back(static_cast<size_t>(shape.elements()));
      EXPECT_EQ(codecs.back()->decode_blocks(slots.back().data(), 0, 1, decoded.back().data(), static_cast<size_t>(channels), 0).status,
                DecodeStatus::ok);
      EXPECT_EQ(decoded.back(), tile.elements);
    }
    for (int h = 0; h < halves; ++h) {
      compressed[h].codec = codecs[static_cast<size_t>(h)].get();
      compressed[h].slot = slots[static_cast<size_t>(h)].data();
      for (int t = 0; t < kTileTokens; ++t) raw[h].rows[t] = decoded[static_cast<size_t>(h)].data() + static_cast<size_t>(t) * channels;
    }
  }
};

/// Same bits everywhere, except that with `nan_is_nan` a NaN matches any NaN: which payload a NaN
/// result carries is not part of the contract (IEEE 754 leaves it open, and compilers swap the
/// operands of a + b). Without it a NaN anywhere is a difference.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b, bool nan_is_nan, size_t* at) {
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = nan_is_nan && std::isnan(a[i]) ? std::isnan(b[i])
                                                    : !std::isnan(a[i]) && std::bit_cast<uint32_t>(a[i]) == std::bit_cast<uint32_t>(b[i]);
    if (!same) {
      *at = i;
      return false;
    }
  }
  return true;
}

std::vector<float> random_floats(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

class FusedKernels : public ::testing::Test {
 protected:
  bool specials_ = false;  ///< tiles with zeros, subnormals, infinities and NaNs in their raw groups

  /// What `run(kernels, compressed)` gives for every kernel set under test, by name.
  template <class Run>
  static std::vector<std::pair<std::string, std::vector<float>>> candidates(const Run& run) {
    std::vector<std::pair<std::string, std::vector<float>>> results;
    results.emplace_back("avx2 fused", run(*attention::avx2_kernels(), true));
    if (attention::avx512_kernels() != nullptr) results.emplace_back("avx512 fused", run(*attention::avx512_kernels(), true));
    results.emplace_back("scalar fused", run(attention::scalar_kernels(), true));
    results.emplace_back("avx2 raw", run(*attention::avx2_kernels(), false));
    return results;
  }

  void SetUp() override {
    if (attention::avx2_kernels() == nullptr) GTEST_SKIP() << "no AVX2 kernels on this machine";
  }

  /// Scores of tokens [first, end) for `heads` query heads: AVX2 fused, scalar fused, AVX2 and
  /// scalar raw over the decoded rows, all the same bits; the other tokens' scores untouched.
  void check_keys(const CodedHead& k, int first, int end, int heads, std::mt19937_64& rng, const std::string& what) {
    const int head_dim = k.halves * k.channels;
    std::vector<float> q = random_floats(static_cast<size_t>(heads) * head_dim, rng);
    for (float& x : q) x = bf16_to_float(float_to_bf16(x));  // as the driver rounds them
    const float scale = 0.125f;
    const auto run = [&](const Kernels& kernels, bool compressed) {
      std::vector<float> scores(static_cast<size_t>(heads) * kTileTokens, -1234.5f);
      const BlockTask task{compressed ? k.compressed : k.raw, k.halves, k.channels, first, end, heads};
      if (!compressed) {
        kernels.key_scores_raw(task, q.data(), scale, scores.data());
      } else if (kernels.prepare_compressed_query != nullptr) {
        std::vector<float> prepared(q.size());
        kernels.prepare_compressed_query(heads, head_dim, q.data(), prepared.data());
        kernels.key_scores_compressed(task, prepared.data(), scale, scores.data());
      } else {
        kernels.key_scores_compressed(task, q.data(), scale, scores.data());
      }
      return scores;
    };
    const std::vector<float> want = run(attention::scalar_kernels(), false);
    for (int g = 0; g < heads; ++g) {
      for (int t = 0; t < kTileTokens; ++t) {
        if (t < first || t >= end) {
          ASSERT_EQ(want[static_cast<size_t>(g * kTileTokens + t)], -1234.5f) << "token " << t << " outside the range was written";
        }
      }
    }
    for (const auto& [name, got] : candidates(run)) {
      size_t at = 0;
      ASSERT_TRUE(same_bits(got, want, specials_, &at)) << name << " differs from scalar raw at head " << at / kTileTokens << ", token "
                                             << at % kTileTokens << ": " << got[at] << " vs " << want[at] << " (" << what
                                             << ", tokens " << first << ".." << end << ", " << heads << " heads)";
    }
  }

  /// The fold of tokens [first, end) into random accumulators, the same four ways. Rescales are 1
  /// (skipped) for about half the tokens.
  void check_values(const CodedHead& v, int first, int end, int heads, std::mt19937_64& rng, const std::string& what) {
    const int head_dim = v.halves * v.channels;
    const std::vector<float> acc0 = random_floats(static_cast<size_t>(heads) * head_dim, rng);
    std::vector<float> rescale = random_floats(static_cast<size_t>(heads) * kTileTokens, rng);
    std::vector<float> weight = random_floats(static_cast<size_t>(heads) * kTileTokens, rng);
    for (size_t i = 0; i < rescale.size(); ++i) {
      if (rng() % 2) rescale[i] = 1.0f;
      rescale[i] = std::fabs(rescale[i]);
      weight[i] = std::fabs(weight[i]);
    }
    const auto run = [&](const Kernels& kernels, bool compressed) {
      std::vector<float> acc = acc0;
      const BlockTask task{compressed ? v.compressed : v.raw, v.halves, v.channels, first, end, heads};
      (compressed ? kernels.fold_values_compressed : kernels.fold_values_raw)(task, rescale.data(), weight.data(), acc.data());
      return acc;
    };
    const std::vector<float> want = run(attention::scalar_kernels(), false);
    for (const auto& [name, got] : candidates(run)) {
      size_t at = 0;
      ASSERT_TRUE(same_bits(got, want, specials_, &at)) << name << " differs from scalar raw at head " << at / head_dim << ", channel "
                                             << at % head_dim << ": " << got[at] << " vs " << want[at] << " (" << what
                                             << ", tokens " << first << ".." << end << ", " << heads << " heads)";
    }
  }

  /// Both kinds of one mode pattern (one per half), for the given ranges and head counts.
  void check_both(int head_dim, const std::vector<std::vector<GroupMode>>& modes, Backend backend, size_t capacity,
                  const std::vector<std::pair<int, int>>& ranges, std::mt19937_64& rng, const std::string& what) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      const CodedHead head(kind, head_dim, modes, backend, capacity, rng, specials_);
      for (const auto& [first, end] : ranges) {
        const int heads = 1 + static_cast<int>(rng() % 5);
        if (kind == TensorKind::key) {
          check_keys(head, first, end, heads, rng, what + ", keys");
        } else {
          check_values(head, first, end, heads, rng, what + ", values");
        }
      }
    }
  }
};

constexpr int kHeadDims[] = {64, 128, 256};

std::vector<std::pair<int, int>> every_range() {
  std::vector<std::pair<int, int>> ranges;
  for (int first = 0; first < kTileTokens; ++first) {
    for (int end = first + 1; end <= kTileTokens; ++end) ranges.emplace_back(first, end);
  }
  return ranges;
}

TEST_F(FusedKernels, EveryModeMixEveryTokenRange) {
  std::mt19937_64 rng(1);
  for (const int head_dim : kHeadDims) {
    const TileShape shape{TensorKind::key, head_dim == 64 ? 64 : 128};
    const int halves = head_dim / shape.channels;
    const double mixes[][2] = {{0.0, 0.0}, {0.1, 0.0}, {0.1, 0.004}, {0.5, 0.05}, {1.0, 0.0}};
    for (const auto& mix : mixes) {
      std::vector<std::vector<GroupMode>> modes;
      for (int h = 0; h < halves; ++h) modes.push_back(random_modes(shape, rng, mix[0], mix[1]));
      const std::string what = "head_dim " + std::to_string(head_dim) + ", 4-bit " + std::to_string(mix[0]) + ", raw " + std::to_string(mix[1]);
      check_both(head_dim, modes, Backend::automatic, shape.max_slot_capacity(), every_range(), rng, what);
    }
  }
}

TEST_F(FusedKernels, EveryHeadCount) {
  std::mt19937_64 rng(2);
  for (const int head_dim : kHeadDims) {
    const TileShape shape{TensorKind::value, head_dim == 64 ? 64 : 128};
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      std::vector<std::vector<GroupMode>> modes;
      for (int h = 0; h < head_dim / shape.channels; ++h) modes.push_back(random_modes(shape, rng, 0.1, 0.01));
      const CodedHead head(kind, head_dim, modes, Backend::automatic, shape.max_slot_capacity(), rng, specials_);
      for (int heads = 1; heads <= 5; ++heads) {
        for (const auto& [first, end] : {std::pair{0, 16}, std::pair{5, 6}, std::pair{3, 13}}) {
          const std::string what = "head_dim " + std::to_string(head_dim);
          if (kind == TensorKind::key) {
            check_keys(head, first, end, heads, rng, what);
          } else {
            check_values(head, first, end, heads, rng, what);
          }
        }
      }
    }
  }
}

TEST_F(FusedKernels, ARawGroupAtEveryPosition) {
  // Group g raw, in every lane and every place of its row of 16 groups (so in every register and
  // dword the vector pass makes), with 4-bit groups around it, after it in its row among them.
  std::mt19937_64 rng(3);
  for (const int head_dim : {64, 128}) {
    const TileShape shape{TensorKind::key, head_dim};
    for (int g = 0; g < shape.groups(); ++g) {
      std::vector<GroupMode> modes = random_modes(shape, rng, 0.2, 0.0);
      modes[static_cast<size_t>(g)] = GroupMode::raw;
      if (g + 1 < shape.groups()) modes[static_cast<size_t>(g + 1)] = GroupMode::bits4;
      const int t = static_cast<int>(rng() % kTileTokens);
      check_both(head_dim, {modes}, Backend::automatic, shape.max_slot_capacity(), {{0, 16}, {t, t + 1}}, rng,
                 "raw group " + std::to_string(g) + " of " + std::to_string(head_dim));
    }
  }
}

TEST_F(FusedKernels, EscapeSlotFullOfRawGroups) {
  // As many raw groups as the largest slot holds (240 of 256 for 128 channels, 118 and two 4-bit
  // groups of 128 for 64), and the smallest slot with escapes (16 bytes: three raw groups, one 4-bit).
  std::mt19937_64 rng(4);
  for (const int head_dim : kHeadDims) {
    const TileShape shape{TensorKind::key, head_dim == 64 ? 64 : 128};
    const int halves = head_dim / shape.channels;
    for (const size_t capacity : {shape.max_slot_capacity(), size_t{16}}) {
      for (int round = 0; round < 3; ++round) {
        std::vector<std::vector<GroupMode>> modes;
        for (int h = 0; h < halves; ++h) modes.push_back(full_slot_modes(shape, capacity, rng));
        check_both(head_dim, modes, Backend::automatic, capacity, {{0, 16}, {7, 9}}, rng,
                   "full slot, capacity " + std::to_string(capacity) + ", head_dim " + std::to_string(head_dim));
      }
    }
  }
}

TEST_F(FusedKernels, ZerosSubnormalsInfinitiesAndNaNs) {
  specials_ = true;
  std::mt19937_64 rng(6);
  for (const int head_dim : kHeadDims) {
    const TileShape shape{TensorKind::key, head_dim == 64 ? 64 : 128};
    for (int round = 0; round < 4; ++round) {
      std::vector<std::vector<GroupMode>> modes;
      for (int h = 0; h < head_dim / shape.channels; ++h) modes.push_back(random_modes(shape, rng, 0.1, 0.02));
      check_both(head_dim, modes, Backend::automatic, shape.max_slot_capacity(), {{0, 16}, {1, 15}, {9, 10}}, rng,
                 "specials, head_dim " + std::to_string(head_dim));
    }
  }
}

TEST_F(FusedKernels, CodecsOfTheScalarBackend) {
  // A codec whose bases are prepared for another backend: the fused kernels prepare their own.
  std::mt19937_64 rng(5);
  for (const int head_dim : kHeadDims) {
    const TileShape shape{TensorKind::key, head_dim == 64 ? 64 : 128};
    std::vector<std::vector<GroupMode>> modes;
    for (int h = 0; h < head_dim / shape.channels; ++h) modes.push_back(random_modes(shape, rng, 0.1, 0.01));
    check_both(head_dim, modes, Backend::scalar, shape.max_slot_capacity(), {{0, 16}, {2, 11}}, rng,
               "scalar codecs, head_dim " + std::to_string(head_dim));
  }
}

TEST_F(FusedKernels, PreparedQueriesArePermutedCopies) {
  // prepare_compressed_query moves every float once: a permutation within each 64 channels.
  std::vector<attention::PrepareQueryFn> prepares{attention::avx2_kernels()->prepare_compressed_query};
  if (attention::avx512_kernels() != nullptr) prepares.push_back(attention::avx512_kernels()->prepare_compressed_query);
  for (const attention::PrepareQueryFn prepare : prepares) {
  ASSERT_NE(prepare, nullptr);
  for (const int head_dim : kHeadDims) {
    for (int heads = 1; heads <= 3; ++heads) {
      std::vector<float> q(static_cast<size_t>(heads) * head_dim), out(q.size(), -1.0f);
      for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i);
      prepare(heads, head_dim, q.data(), out.data());
      std::vector<int> seen(q.size(), 0);
      for (size_t i = 0; i < out.size(); ++i) {
        const auto from = static_cast<size_t>(out[i]);
        ASSERT_LT(from, q.size());
        EXPECT_EQ(from / 64, i / 64) << "float " << i << " comes from another 64 channels";
        ++seen[from];
      }
      for (const int n : seen) EXPECT_EQ(n, 1);
    }
  }
  }
}

TEST_F(FusedKernels, AvxFiveTwelveWhereTheCpuHasIt) {
  // The AVX-512 set is offered exactly when the CPU has its subset (every test above then runs it).
  EXPECT_EQ(attention::avx512_kernels() != nullptr, cpu_features().avx512_set());
  if (attention::avx512_kernels() == nullptr) GTEST_SKIP() << "no AVX-512 (F, BW, VL, VBMI) on this machine";
  EXPECT_EQ(&attention::best_kernels(), attention::avx512_kernels());
}

}  // namespace
}  // namespace gaac
