// Test inputs for the FP8 tile codec: bases, every byte pattern, seeded random and adversarial tiles.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "gaac/fp8_codec.hpp"

namespace gaac::test {

/// An FP8 tile's bytes (row-major, 16 × channels) and its bases.
struct Fp8TileCase {
  Fp8TileShape shape;
  std::vector<uint8_t> elements;
  std::vector<uint8_t> b2;
  std::vector<uint8_t> b3;

  Fp8TileBases bases() const { return {b2, b3}; }
  /// Element (token, channel).
  uint8_t& at(int token, int channel) { return elements[static_cast<size_t>(token) * shape.tile.channels + channel]; }
};

/// Every FP8 tile shape: both formats × both kinds × both widths.
std::vector<Fp8TileShape> all_fp8_shapes();

/// Builds an FP8 byte from its sign, exponent and mantissa.
uint8_t fp8_bits(ElementFormat format, int sign, int exponent, int mantissa);

/// A tile of zeros whose every channel has bases b2 and b3.
Fp8TileCase uniform_fp8_tile(Fp8TileShape shape, int b2, int b3);

/// Fills `tile` with the byte patterns 0..255 (repeated) in every other group, so the escapes of the raw
/// groups they force fit the largest slot; the other groups' elements lie inside the 2-bit window of
/// the tile's b2 (channel 0's). Every pattern appears at least once (twice for 64 channels, four times
/// for 128), and at every position within a group.
void fill_every_pattern(Fp8TileCase& tile);

/// Random tile whose exponents fall in the 2-bit window with probability p2, else in the 3-bit window
/// with probability p3, else anywhere; signs and mantissas uniform; bases random in their range.
Fp8TileCase random_fp8_tile(Fp8TileShape shape, std::mt19937_64& rng, double p2, double p3);

/// Encodes then decodes with `backend`; returns the decoded bytes (fails the test on a bad status).
std::vector<uint8_t> fp8_round_trip(const Fp8TileCase& tile, size_t capacity, Backend backend, TileEncoding* encoding = nullptr);

}  // namespace gaac::test
