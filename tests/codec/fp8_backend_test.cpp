// Each vector FP8 kernel set (AVX2; AVX2 with GFNI, which Backend::avx2 runs where the CPU has it)
// against the scalar oracle: equal slot bytes, counts, decoded bytes and statuses on every byte pattern,
// adversarial tiles (all raw, NaNs and infinities, subnormals), seeded random mixes of modes at every
// capacity, strided rows, arbitrary slot bytes, and each nonzero padding byte. A set the machine lacks is
// skipped.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/fp8_kernels.hpp"
#include "gaac/fp8_codec.hpp"
#include "support/fp8_tile_data.hpp"

namespace gaac {
namespace {

using detail::Fp8KernelSet;
using test::Fp8TileCase;

/// One kernel set's kernels behind the calls of Fp8TileCodec these tests make (one tile a call).
class SetCodec {
 public:
  SetCodec(Fp8TileShape shape, const Fp8TileBases& bases, size_t capacity, Fp8KernelSet set)
      : shape_(shape), capacity_(capacity), kernels_(detail::fp8_kernels(set, shape)) {
    kernels_.prepare(bases, prepared_.data());
  }
  size_t slot_bytes() const { return shape_.slot_bytes(capacity_); }
  void encode_blocks(const uint8_t* src, size_t row_stride, size_t, size_t, uint8_t* slot, size_t, TileEncoding* result) const {
    *result = kernels_.encode(prepared_.data(), src, row_stride, capacity_, slot);
  }
  BlockDecodeResult decode_blocks(const uint8_t* slot, size_t, size_t, uint8_t* dst, size_t row_stride, size_t) const {
    const DecodeStatus status = kernels_.decode(prepared_.data(), slot, capacity_, dst, row_stride);
    return {status == DecodeStatus::ok ? size_t{1} : size_t{0}, status};
  }

 private:
  Fp8TileShape shape_;
  size_t capacity_;
  detail::Fp8ShapeKernels kernels_;
  alignas(64) std::array<uint8_t, Fp8TileCodec::kPreparedBytes> prepared_{};
};

class Fp8Backends : public testing::TestWithParam<Fp8KernelSet> {
 protected:
  void SetUp() override {
    if (!detail::fp8_kernel_set_available(GetParam())) GTEST_SKIP() << to_string(GetParam()) << " not available on this machine";
  }
};

/// Encodes with the scalar backend and the kernel set under test into rows `stride` apart and checks
/// equal results, then decodes the slot with both and checks equal statuses and bytes (and, when it
/// fits, the original tile).
void expect_same(Fp8KernelSet set, const Fp8TileCase& tile, size_t capacity, size_t stride) {
  const Fp8TileShape shape = tile.shape;
  const auto channels = static_cast<size_t>(shape.tile.channels);
  std::vector<uint8_t> rows(stride * kTileTokens, 0x5A);
  for (int t = 0; t < kTileTokens; ++t) std::memcpy(rows.data() + t * stride, tile.elements.data() + t * channels, channels);
  const Fp8TileCodec scalar(shape, tile.bases(), capacity, Backend::scalar);
  const SetCodec avx2(shape, tile.bases(), capacity, set);
  std::vector<uint8_t> a(scalar.slot_bytes(), 0x11), b(avx2.slot_bytes(), 0x22);
  TileEncoding ea, eb;
  scalar.encode_blocks(rows.data(), stride, 0, 1, a.data(), 0, &ea);
  avx2.encode_blocks(rows.data(), stride, 0, 1, b.data(), 0, &eb);
  ASSERT_EQ(ea.groups_by_mode, eb.groups_by_mode);
  ASSERT_EQ(ea.escape_bytes, eb.escape_bytes);
  ASSERT_EQ(ea.fits, eb.fits);
  if (!ea.fits) return;
  ASSERT_EQ(a, b) << to_string(shape.format) << " channels " << channels << " kind " << int(shape.tile.kind);
  std::vector<uint8_t> da(stride * kTileTokens, 0x33), db(stride * kTileTokens, 0x33);
  ASSERT_EQ(scalar.decode_blocks(a.data(), 0, 1, da.data(), stride, 0).status, DecodeStatus::ok);
  ASSERT_EQ(avx2.decode_blocks(a.data(), 0, 1, db.data(), stride, 0).status, DecodeStatus::ok);
  ASSERT_EQ(da, db);
  for (int t = 0; t < kTileTokens; ++t) ASSERT_EQ(std::memcmp(db.data() + t * stride, rows.data() + t * stride, channels), 0);
}

TEST_P(Fp8Backends, AgreeOnEveryBytePattern) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    for (const auto& b : {std::pair{0, 0}, std::pair{7, 4}, std::pair{fp8_max_base2(shape.format), fp8_max_base3(shape.format)}}) {
      Fp8TileCase tile = test::uniform_fp8_tile(shape, b.first, b.second);
      test::fill_every_pattern(tile);
      expect_same(GetParam(), tile, shape.max_slot_capacity(), static_cast<size_t>(shape.tile.channels));
    }
  }
}

TEST_P(Fp8Backends, AgreeOnAdversarialTiles) {
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const auto top = static_cast<uint8_t>(fp8_max_base2(shape.format)), top3 = static_cast<uint8_t>(fp8_max_base3(shape.format));
    // All raw (never fits), all NaN/Inf at the top, all subnormals at the bottom, every element its own
    // byte value modulo 256 with bases at the top (mostly raw groups, overflowing).
    Fp8TileCase raw = test::uniform_fp8_tile(shape, top, top3), nan = raw, sub = test::uniform_fp8_tile(shape, 0, 0), mix = raw;
    for (size_t i = 0; i < raw.elements.size(); ++i) {
      raw.elements[i] = test::fp8_bits(shape.format, int(i & 1), 0, int(i));
      nan.elements[i] = static_cast<uint8_t>(0x7F | (i % 3 == 0 ? 0x80 : 0));
      sub.elements[i] = test::fp8_bits(shape.format, int(i / 7 % 2), 0, int(i));
      mix.elements[i] = static_cast<uint8_t>(i * 37);
    }
    for (const Fp8TileCase* tile : {&raw, &nan, &sub, &mix}) {
      for (size_t capacity = 0; capacity <= shape.max_slot_capacity(); capacity += 16) {
        expect_same(GetParam(), *tile, capacity, static_cast<size_t>(shape.tile.channels));
      }
    }
  }
}

TEST_P(Fp8Backends, AgreeOnSeededRandomTilesAtEveryCapacityAndStride) {
  std::mt19937_64 rng(21);
  const double mixes[][2] = {{1.0, 0.0}, {0.3, 0.6}, {0.1, 0.85}, {0.5, 0.45}, {0.0, 0.9}, {0.3, 0.3}};
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    for (const auto& mix : mixes) {
      for (int i = 0; i < 6; ++i) {
        const Fp8TileCase tile = test::random_fp8_tile(shape, rng, mix[0], mix[1]);
        const size_t capacity = rng() % (shape.max_slot_capacity() / 16 + 1) * 16;
        const size_t stride = static_cast<size_t>(shape.tile.channels) + (i % 2 == 0 ? 0 : 32 * (1 + rng() % 4));
        expect_same(GetParam(), tile, capacity, stride);
        expect_same(GetParam(), tile, shape.max_slot_capacity(), stride);
      }
    }
  }
}

TEST_P(Fp8Backends, AgreeOnArbitrarySlotBytes) {
  std::mt19937_64 rng(4);
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const Fp8TileCase bases = test::random_fp8_tile(shape, rng, 0.5, 0.5);
    for (const size_t capacity : {size_t{0}, size_t{16}, shape.max_slot_capacity()}) {
      const Fp8TileCodec scalar(shape, bases.bases(), capacity, Backend::scalar);
      const SetCodec avx2(shape, bases.bases(), capacity, GetParam());
      int decoded = 0;
      for (int i = 0; i < 300; ++i) {
        std::vector<uint8_t> slot(scalar.slot_bytes());
        for (auto& x : slot) x = static_cast<uint8_t>(rng());
        // Three slots in four have valid tags (random modes while their escapes fit, 2-bit after) and
        // zero padding, so that they decode: random codes, fields and escape bytes.
        if (i % 4 != 0) {
          size_t used = 0;
          const int raw_bytes = exponent_bits(shape.format) - 2;
          for (int g = 0; g < shape.groups(); ++g) {
            const uint64_t pick = rng() % 10;
            int mode = pick < 3 ? 0 : pick < 9 ? 1 : 2;
            const size_t need = mode == 0 ? 0 : mode == 1 ? 1 : static_cast<size_t>(raw_bytes);
            if (used + need > capacity) mode = 0;
            used += mode == 0 ? 0 : need;
            uint8_t& tag = slot[shape.tag_offset() + static_cast<size_t>(g / 4)];
            tag = static_cast<uint8_t>((tag & ~(3u << (2 * (g % 4)))) | static_cast<unsigned>(mode) << (2 * (g % 4)));
          }
          for (size_t e = shape.escape_offset() + used; e < slot.size(); ++e) slot[e] = 0;
        }
        std::vector<uint8_t> da(static_cast<size_t>(shape.elements()), 0), db(da.size(), 0);
        const auto stride = static_cast<size_t>(shape.tile.channels);
        const DecodeStatus sa = scalar.decode_blocks(slot.data(), 0, 1, da.data(), stride, 0).status;
        const DecodeStatus sb = avx2.decode_blocks(slot.data(), 0, 1, db.data(), stride, 0).status;
        ASSERT_EQ(sa, sb) << i;
        if (sa == DecodeStatus::ok) {
          ASSERT_EQ(da, db) << i;
          ++decoded;
        }
      }
      EXPECT_GT(decoded, 0) << "no slot decoded: the comparison of decoded bytes never ran";
    }
  }
}

TEST_P(Fp8Backends, RejectEveryNonzeroPaddingByte) {
  // For tiles whose escapes end at offsets all around 16- and 32-byte blocks, each padding byte in turn is
  // set: both backends must refuse the slot, at capacities just above the escapes and the largest.
  std::mt19937_64 rng(5);
  for (const Fp8TileShape shape : test::all_fp8_shapes()) {
    const Fp8TileCase bases = test::random_fp8_tile(shape, rng, 0.5, 0.5);
    const size_t max_capacity = shape.max_slot_capacity();
    for (const size_t used : {0, 1, 15, 16, 17, 31, 32, 33, 47}) {
      const size_t least = (used + 15) / 16 * 16;
      for (const size_t capacity : {least, least + 16, least + 32, least + 48, max_capacity}) {
        if (capacity > max_capacity) continue;
        const Fp8TileCodec scalar(shape, bases.bases(), capacity, Backend::scalar);
        const SetCodec avx2(shape, bases.bases(), capacity, GetParam());
        std::vector<uint8_t> slot(scalar.slot_bytes(), 0);
        // The first `used` groups are 3-bit (one escape byte each, nonzero), the others 2-bit.
        for (size_t g = 0; g < used; ++g) {
          slot[shape.tag_offset() + g / 4] |= static_cast<uint8_t>(1u << (2 * (g % 4)));
          slot[shape.escape_offset() + g] = static_cast<uint8_t>(1 + rng() % 255);
        }
        std::vector<uint8_t> da(static_cast<size_t>(shape.elements())), db(da.size());
        const auto stride = static_cast<size_t>(shape.tile.channels);
        ASSERT_EQ(avx2.decode_blocks(slot.data(), 0, 1, db.data(), stride, 0).status, DecodeStatus::ok);
        for (size_t e = used; e < capacity; ++e) {
          slot[shape.escape_offset() + e] = 0x40;
          ASSERT_EQ(scalar.decode_blocks(slot.data(), 0, 1, da.data(), stride, 0).status, DecodeStatus::nonzero_padding);
          ASSERT_EQ(avx2.decode_blocks(slot.data(), 0, 1, db.data(), stride, 0).status, DecodeStatus::nonzero_padding)
              << "used " << used << " capacity " << capacity << " byte " << e;
          slot[shape.escape_offset() + e] = 0;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KernelSets, Fp8Backends, testing::Values(Fp8KernelSet::avx2, Fp8KernelSet::avx2_gfni),
                         [](const testing::TestParamInfo<Fp8KernelSet>& param) { return std::string(to_string(param.param)); });

/// Backend::avx2 runs the GFNI set exactly where the probe finds GFNI (and this build has it).
TEST(Fp8Dispatch, Avx2BackendRunsGfniWhereAvailable) {
  if (!backend_available(Backend::avx2)) GTEST_SKIP() << "no AVX2 on this machine";
  const bool gfni = detail::fp8_kernel_set_available(Fp8KernelSet::avx2_gfni);
  EXPECT_EQ(detail::fp8_kernel_set(Backend::avx2), gfni ? Fp8KernelSet::avx2_gfni : Fp8KernelSet::avx2);
  EXPECT_EQ(detail::fp8_kernel_set(Backend::scalar), Fp8KernelSet::scalar);
}

}  // namespace
}  // namespace gaac
