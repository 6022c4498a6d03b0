// The GPU's per-lane GAAC-FP8 decoder and FP8 widening (src/cuda/lane_fp8.cuh) run on the host, lane by
// lane, against the reference FP8 codec and the CPU attention's widening table: every code of every
// quad must come back, and every register must hold the codes' exact BF16 values.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "attention/fp8_widening.hpp"
#include "cuda/lane_fp8.cuh"
#include "gaac/fp8_codec.hpp"
#include "support/fp8_tile_data.hpp"

namespace gaac {
namespace {

using namespace gaac::cuda::lane;

/// Decodes `slot` the way a warp does (escape offsets by an exclusive scan, every lane's groups in the
/// kernel's order) and returns the tile's codes row-major.
template <int C, ElementFormat F>
std::vector<uint8_t> decode_like_a_warp(Fp8TileShape shape, const std::vector<uint8_t>& slot, const Fp8TileBases& bases) {
  const bool key = shape.tile.kind == TensorKind::key;
  uint32_t offset[kWarpLanes];
  uint32_t running = 0;
  for (int lane = 0; lane < kWarpLanes; ++lane) {
    offset[lane] = running;
    running += fp8_escape_bytes_of_lane<C, F>(fp8_lane_tags<C, F>(slot.data(), lane));
  }
  std::vector<uint8_t> out(static_cast<size_t>(shape.elements()), 0);
  std::vector<uint8_t> b2(bases.b2.begin(), bases.b2.end()), b3(bases.b3.begin(), bases.b3.end());
  std::vector<uint32_t> spread(kSpreadEntries);
  for (uint32_t i = 0; i < spread.size(); ++i) spread[i] = spread_entry(i);
  for (int lane = 0; lane < kWarpLanes; ++lane) {
    const auto word = [&](const std::vector<uint8_t>& b, int w) {
      return key ? base_word<C, true>(b.data(), lane, w) : base_word<C, false>(b.data(), lane, w);
    };
    const auto base2 = [&](int w) { return word(b2, w); };
    const auto base3 = [&](int w) { return word(b3, w); };
    std::vector<int> seen;
    const auto use = [&](auto group, const Fp8Quad (&quads)[2]) {
      seen.push_back(decltype(group)::value);
      for (int q = 0; q < 2; ++q) {
        const uint32_t codes = fp8_codes<F>(quads[q]);
        for (int byte = 0; byte < 4; ++byte) {
          const ElementSlot at = element_slot(shape.tile, lane, 2 * decltype(group)::value + q, byte);
          out[static_cast<size_t>(at.token) * C + at.channel] = static_cast<uint8_t>(codes >> (8 * byte));
        }
      }
    };
    if (key) fp8_decode_groups<C, F, true>(slot.data(), lane, offset[lane], base2, base3, spread.data(), use);
    else fp8_decode_groups<C, F, false>(slot.data(), lane, offset[lane], base2, base3, spread.data(), use);
    EXPECT_EQ(static_cast<int>(seen.size()), C / 16);
  }
  return out;
}

std::vector<uint8_t> decode_like_a_warp(const test::Fp8TileCase& tile, const std::vector<uint8_t>& slot) {
  const Fp8TileShape s = tile.shape;
  const bool e4 = s.format == ElementFormat::e4m3;
  if (s.tile.channels == 128)
    return e4 ? decode_like_a_warp<128, ElementFormat::e4m3>(s, slot, tile.bases())
              : decode_like_a_warp<128, ElementFormat::e5m2>(s, slot, tile.bases());
  return e4 ? decode_like_a_warp<64, ElementFormat::e4m3>(s, slot, tile.bases())
            : decode_like_a_warp<64, ElementFormat::e5m2>(s, slot, tile.bases());
}

/// Encodes `tile` with the largest capacity (plus the 16 bytes of padding the GPU may read past it);
/// false when its escapes do not fit.
bool encode(const test::Fp8TileCase& tile, std::vector<uint8_t>& slot) {
  const size_t cap = tile.shape.max_slot_capacity();
  slot.assign(tile.shape.slot_bytes(cap) + 16, 0);
  const TileEncoding enc = encode_fp8_tile(tile.shape, tile.elements.data(), static_cast<size_t>(tile.shape.tile.channels),
                                           tile.bases(), cap, std::span<uint8_t>(slot.data(), tile.shape.slot_bytes(cap)));
  return enc.fits;
}

TEST(LaneFp8Decode, RandomTilesOfEveryModeMix) {
  std::mt19937_64 rng(23);
  // (p2, p3): all 2-bit; the real mix; mostly 3-bit; many raw groups; all raw.
  const double mixes[][2] = {{1.0, 0.0}, {0.3, 0.6}, {0.05, 0.9}, {0.3, 0.4}, {0.0, 0.0}};
  int decoded = 0;
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    for (const auto& mix : mixes) {
      for (int rep = 0; rep < 40; ++rep) {
        const test::Fp8TileCase tile = test::random_fp8_tile(shape, rng, mix[0], mix[1]);
        std::vector<uint8_t> slot;
        if (!encode(tile, slot)) continue;
        ASSERT_EQ(decode_like_a_warp(tile, slot), tile.elements)
            << to_string(shape.format) << " channels " << shape.tile.channels << " kind " << int(shape.tile.kind)
            << " mix " << mix[0] << "/" << mix[1] << " rep " << rep;
        ++decoded;
      }
    }
  }
  EXPECT_GT(decoded, 500);
}

TEST(LaneFp8Decode, EveryBytePattern) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    test::Fp8TileCase tile = test::uniform_fp8_tile(shape, fp8_max_base2(shape.format) / 2, fp8_max_base3(shape.format) / 2);
    test::fill_every_pattern(tile);
    std::vector<uint8_t> slot;
    ASSERT_TRUE(encode(tile, slot));
    ASSERT_EQ(decode_like_a_warp(tile, slot), tile.elements) << to_string(shape.format) << " " << shape.tile.channels;
  }
}

template <ElementFormat F>
void check_widening() {
  const attention::Fp8Widening& table = attention::fp8_widening(F);
  int specials = 0;
  for (uint32_t x = 0; x < 256; ++x) {
    // The code in every byte position, beside three other codes.
    for (int b = 0; b < 4; ++b) {
      const uint32_t others[4] = {0x00u, 0x38u, 0xB1u, 0x05u};
      uint32_t codes = 0;
      for (int k = 0; k < 4; ++k) codes |= (k == b ? x : others[k]) << (8 * k);
      const Fp8Quad q = fp8_quad<F>(codes);
      ASSERT_EQ(fp8_codes<F>(q), codes);
      const uint16_t exact = table[x];
      const bool special = (exact & 0x7F80u) == 0x7F80u;  // NaN or infinity
      ASSERT_EQ(fp8_special_codes<F>(codes) != 0u, special) << "code " << x;
      uint32_t r[2], t[2];
      widen_exact<F>(q, table.data(), t[0], t[1]);
      EXPECT_EQ(static_cast<uint16_t>(t[b % 2] >> (16 * (b / 2))), exact);
      if (special) {
        ++specials;
        continue;
      }
      widen_fast<F>(q, r[0], r[1]);
      ASSERT_EQ(static_cast<uint16_t>(r[b % 2] >> (16 * (b / 2))), exact) << "code " << x << " byte " << b;
    }
  }
  // E4M3: two NaN codes; E5M2: six NaNs and two infinities; each at four positions.
  EXPECT_EQ(specials, 4 * (F == ElementFormat::e4m3 ? 2 : 8));
}

TEST(LaneFp8Widening, EveryCodeFastAndExact) {
  check_widening<ElementFormat::e4m3>();
  check_widening<ElementFormat::e5m2>();
}

}  // namespace
}  // namespace gaac
