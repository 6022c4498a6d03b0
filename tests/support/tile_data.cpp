#include "support/tile_data.hpp"

#include <gtest/gtest.h>

namespace gaac::test {

std::vector<TileShape> all_shapes() {
  return {{TensorKind::key, 64}, {TensorKind::key, 128}, {TensorKind::value, 64}, {TensorKind::value, 128}};
}

uint16_t bf16_bits(int sign, int exponent, int mantissa) {
  return static_cast<uint16_t>((sign & 1) << 15 | (exponent & 0xFF) << 7 | (mantissa & 0x7F));
}

TileCase uniform_bases_tile(TileShape shape, int b3, int b4) {
  return {shape, std::vector<uint16_t>(static_cast<size_t>(shape.elements())),
          std::vector<uint8_t>(static_cast<size_t>(shape.channels), static_cast<uint8_t>(b3)),
          std::vector<uint8_t>(static_cast<size_t>(shape.channels), static_cast<uint8_t>(b4))};
}

uint32_t fill_pattern_tile(TileCase& tile, uint32_t first) {
  const TileShape shape = tile.shape;
  const int b3 = tile.b3.front();
  for (size_t i = 0; i < tile.elements.size(); ++i) tile.elements[i] = bf16_bits(int(i & 1), b3 + int(i % 8), int(i));
  uint32_t next = first;
  for (int k = 0; k < shape.groups() / 2; ++k, ++next) {
    const int lane = (2 * k) / shape.groups_per_lane();
    const int pair = (2 * k) % shape.groups_per_lane();
    const ElementSlot at = element_slot(shape, lane, 2 * pair + k % 2, k % 4);
    tile.elements[static_cast<size_t>(at.token) * shape.channels + at.channel] = static_cast<uint16_t>(next);
  }
  return next;
}

TileCase random_tile(TileShape shape, std::mt19937_64& rng, double p3, double p4) {
  TileCase tile{shape, std::vector<uint16_t>(static_cast<size_t>(shape.elements())),
                std::vector<uint8_t>(static_cast<size_t>(shape.channels)),
                std::vector<uint8_t>(static_cast<size_t>(shape.channels))};
  std::uniform_int_distribution<int> base3(100, 140);
  std::uniform_int_distribution<int> any(0, 255);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int c = 0; c < shape.channels; ++c) {
    tile.b3[c] = static_cast<uint8_t>(base3(rng));
    tile.b4[c] = static_cast<uint8_t>(tile.b3[c] - 4);
  }
  for (int t = 0; t < kTileTokens; ++t) {
    for (int c = 0; c < shape.channels; ++c) {
      const double r = u(rng);
      int e = r < p3 ? tile.b3[c] + static_cast<int>(rng() % 8)
              : r < p3 + p4 ? tile.b4[c] + static_cast<int>(rng() % 16)
                            : any(rng);
      tile.elements[static_cast<size_t>(t) * shape.channels + c] =
          bf16_bits(static_cast<int>(rng() & 1), e, static_cast<int>(rng() & 0x7F));
    }
  }
  return tile;
}

std::vector<uint16_t> round_trip(const TileCase& tile, size_t capacity, Backend backend, TileEncoding* encoding) {
  const TileShape shape = tile.shape;
  std::vector<uint8_t> slot(shape.slot_bytes(capacity));
  const TileEncoding enc = encode_tile(shape, tile.elements.data(), static_cast<size_t>(shape.channels), tile.bases(),
                                       capacity, slot, backend);
  if (encoding) *encoding = enc;
  std::vector<uint16_t> out(tile.elements.size(), 0xDEAD);
  if (!enc.fits) return out;
  const DecodeStatus status =
      decode_tile(shape, slot, capacity, tile.bases(), out.data(), static_cast<size_t>(shape.channels), backend);
  EXPECT_EQ(status, DecodeStatus::ok) << to_string(status);
  return out;
}

}  // namespace gaac::test
