#include "support/fp8_tile_data.hpp"

#include <gtest/gtest.h>

namespace gaac::test {

std::vector<Fp8TileShape> all_fp8_shapes() {
  std::vector<Fp8TileShape> shapes;
  for (const ElementFormat format : {ElementFormat::e4m3, ElementFormat::e5m2}) {
    for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
      for (const int channels : {64, 128}) shapes.push_back({format, {kind, channels}});
    }
  }
  return shapes;
}

uint8_t fp8_bits(ElementFormat format, int sign, int exponent, int mantissa) {
  const int m = mantissa_bits(format);
  return static_cast<uint8_t>((sign & 1) << 7 | (exponent & ((1 << exponent_bits(format)) - 1)) << m | (mantissa & ((1 << m) - 1)));
}

Fp8TileCase uniform_fp8_tile(Fp8TileShape shape, int b2, int b3) {
  const auto channels = static_cast<size_t>(shape.tile.channels);
  return {shape, std::vector<uint8_t>(static_cast<size_t>(shape.elements())), std::vector<uint8_t>(channels, static_cast<uint8_t>(b2)),
          std::vector<uint8_t>(channels, static_cast<uint8_t>(b3))};
}

void fill_every_pattern(Fp8TileCase& tile) {
  const Fp8TileShape shape = tile.shape;
  const int b2 = tile.b2.front();
  for (int t = 0; t < kTileTokens; ++t) {
    for (int c = 0; c < shape.tile.channels; ++c) tile.at(t, c) = fp8_bits(shape.format, (t + c) & 1, b2 + (t + c) % 4, t * 7 + c);
  }
  int next = 0;
  for (int g = 0; g < shape.groups(); g += 2) {
    const int lane = g / shape.tile.groups_per_lane(), pair = g % shape.tile.groups_per_lane();
    for (int i = 0; i < kGroupSize; ++i, next = (next + 1) % 256) {
      const ElementSlot at = element_slot(shape.tile, lane, 2 * pair + i / kQuadSize, i % kQuadSize);
      tile.at(at.token, at.channel) = static_cast<uint8_t>(next);
    }
    next = (next + 1) % 256;  // shift the patterns' positions inside the group from one group to the next
  }
}

Fp8TileCase random_fp8_tile(Fp8TileShape shape, std::mt19937_64& rng, double p2, double p3) {
  const int top = (1 << exponent_bits(shape.format)) - 1;
  Fp8TileCase tile = uniform_fp8_tile(shape, 0, 0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int c = 0; c < shape.tile.channels; ++c) {
    tile.b3[static_cast<size_t>(c)] = static_cast<uint8_t>(rng() % static_cast<uint64_t>(fp8_max_base3(shape.format) + 1));
    tile.b2[static_cast<size_t>(c)] = static_cast<uint8_t>(tile.b3[static_cast<size_t>(c)] + rng() % 5);
  }
  for (int t = 0; t < kTileTokens; ++t) {
    for (int c = 0; c < shape.tile.channels; ++c) {
      const double r = u(rng);
      const int e = r < p2        ? tile.b2[static_cast<size_t>(c)] + static_cast<int>(rng() % 4)
                    : r < p2 + p3 ? tile.b3[static_cast<size_t>(c)] + static_cast<int>(rng() % 8)
                                  : static_cast<int>(rng() % static_cast<uint64_t>(top + 1));
      tile.at(t, c) = fp8_bits(shape.format, static_cast<int>(rng() & 1), e, static_cast<int>(rng() & 7));
    }
  }
  return tile;
}

std::vector<uint8_t> fp8_round_trip(const Fp8TileCase& tile, size_t capacity, Backend backend, TileEncoding* encoding) {
  const Fp8TileShape shape = tile.shape;
  const auto stride = static_cast<size_t>(shape.tile.channels);
  std::vector<uint8_t> slot(shape.slot_bytes(capacity));
  const TileEncoding enc = encode_fp8_tile(shape, tile.elements.data(), stride, tile.bases(), capacity, slot, backend);
  if (encoding) *encoding = enc;
  std::vector<uint8_t> out(tile.elements.size(), 0xA5);
  if (!enc.fits) return out;
  const DecodeStatus status = decode_fp8_tile(shape, slot, capacity, tile.bases(), out.data(), stride, backend);
  EXPECT_EQ(status, DecodeStatus::ok) << to_string(status);
  return out;
}

}  // namespace gaac::test
