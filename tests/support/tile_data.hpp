// Test inputs for the tile codec: bases, seeded random tiles, and adversarial tiles.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "gaac/codec.hpp"

namespace gaac::test {

/// A tile's BF16 elements (row-major, 16 × channels) and its bases.
struct TileCase {
  TileShape shape;
  std::vector<uint16_t> elements;
  std::vector<uint8_t> b3;
  std::vector<uint8_t> b4;

  TileBases bases() const { return {b3, b4}; }
};

/// Every tile shape the format defines.
std::vector<TileShape> all_shapes();

/// Builds a BF16 value with the given sign, exponent and mantissa.
uint16_t bf16_bits(int sign, int exponent, int mantissa);

/// A tile of zeros whose every channel has bases b3 and b4.
TileCase uniform_bases_tile(TileShape shape, int b3, int b4);

/// Fills `tile` with BF16 patterns `first`, `first` + 1, ... (as many as it has groups / 2), one in
/// every other group so that the escapes of the raw groups they force still fit the largest slot; the
/// other elements lie inside the 3-bit window of the tile's b3 (channel 0's). Returns the next pattern:
/// from 0 until 65,536, successive tiles cover ±0, subnormals, ±Inf and every NaN payload.
uint32_t fill_pattern_tile(TileCase& tile, uint32_t first);

/// Random tile whose exponents fall in the 3-bit window with probability p3, else in the 4-bit
/// window with probability p4, else anywhere; signs and mantissas uniform.
TileCase random_tile(TileShape shape, std::mt19937_64& rng, double p3, double p4);

/// Encodes then decodes with `backend`; returns the decoded elements (fails the test on a bad status).
std::vector<uint16_t> round_trip(const TileCase& tile, size_t capacity, Backend backend, TileEncoding* encoding = nullptr);

}  // namespace gaac::test
