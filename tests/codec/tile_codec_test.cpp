// TileCodec and CalibratedCodecs: validation at construction, batched coding equal to tile-by-tile coding
// with the scalar backend, and decode_blocks stopping at the first bad slot.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gaac/tile_codec.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"
#include "support/tile_data.hpp"

namespace gaac {
namespace {

std::vector<Backend> available_backends() {
  std::vector<Backend> out{Backend::scalar};
  if (backend_available(Backend::avx2)) out.push_back(Backend::avx2);
  return out;
}

TEST(TileCodec, RejectsBadArguments) {
  const test::TileCase ok = test::uniform_bases_tile({TensorKind::key, 128}, 120, 116);
  EXPECT_THROW(TileCodec({TensorKind::key, 96}, ok.bases(), 0), Error);
  EXPECT_THROW(TileCodec(ok.shape, ok.bases(), 8), Error);                                      // not a multiple of 16
  EXPECT_THROW(TileCodec(ok.shape, ok.bases(), ok.shape.max_slot_capacity() + 16), Error);    // too large
  test::TileCase bad = ok;
  bad.b3[5] = kMaxBase3 + 1;
  EXPECT_THROW(TileCodec(bad.shape, bad.bases(), 0), Error);
  bad = ok;
  bad.b4.resize(64);  // fewer bases than channels
  EXPECT_THROW(TileCodec(bad.shape, bad.bases(), 0), Error);
  const TileCodec codec(ok.shape, ok.bases(), 32);
  EXPECT_EQ(codec.slot_bytes(), ok.shape.slot_bytes(32));
  EXPECT_NE(codec.backend(), Backend::automatic);
}

/// Several random tiles with per-tile strides and slot strides: encode_blocks gives the bytes and
/// encodings of one-tile calls, decode_blocks gives back every value, junk between tiles
/// untouched.
TEST(TileCodec, BatchedCodingEqualsTileByTile) {
  std::mt19937_64 rng(11);
  for (const TileShape shape : test::all_shapes()) {
    const test::TileCase first = test::random_tile(shape, rng, 0.9, 0.09);
    constexpr size_t kTiles = 7;
    const size_t row_stride = static_cast<size_t>(shape.channels) + 24;
    const size_t tile_stride = kTileTokens * row_stride + 40;
    std::vector<uint16_t> src(kTiles * tile_stride, 0xBEEF);
    for (size_t i = 0; i < kTiles; ++i) {
      const test::TileCase tile = test::random_tile(shape, rng, 0.88, 0.11);
      for (int t = 0; t < kTileTokens; ++t) {
        for (int c = 0; c < shape.channels; ++c) {
          src[i * tile_stride + static_cast<size_t>(t) * row_stride + static_cast<size_t>(c)] =
              tile.elements[static_cast<size_t>(t * shape.channels + c)];
        }
      }
    }
    const size_t capacity = 64;
    for (const Backend backend : available_backends()) {
      const TileCodec codec(shape, first.bases(), capacity, backend);
      const size_t slot_stride = codec.slot_bytes() + 48;
      std::vector<uint8_t> slots(kTiles * slot_stride, 0x77);
      std::vector<TileEncoding> encodings(kTiles);
      codec.encode_blocks(src.data(), row_stride, tile_stride, kTiles, slots.data(), slot_stride, encodings.data());
      for (size_t i = 0; i < kTiles; ++i) {
        std::vector<uint8_t> expected(codec.slot_bytes());
        const TileEncoding want = encode_tile(shape, src.data() + i * tile_stride, row_stride, first.bases(), capacity,
                                              expected, Backend::scalar);
        EXPECT_EQ(encodings[i].escape_bytes, want.escape_bytes);
        EXPECT_EQ(encodings[i].fits, want.fits);
        EXPECT_EQ(encodings[i].groups_by_mode, want.groups_by_mode);
        if (!want.fits) continue;
        EXPECT_TRUE(std::equal(expected.begin(), expected.end(), slots.begin() + static_cast<std::ptrdiff_t>(i * slot_stride)));
        for (size_t j = codec.slot_bytes(); j < slot_stride; ++j) EXPECT_EQ(slots[i * slot_stride + j], 0x77);
      }
      // Decode only the tiles that fit, packed into a batch of their own.
      std::vector<uint8_t> fitting;
      std::vector<size_t> which;
      for (size_t i = 0; i < kTiles; ++i) {
        if (!encodings[i].fits) continue;
        fitting.insert(fitting.end(), slots.begin() + static_cast<std::ptrdiff_t>(i * slot_stride),
                       slots.begin() + static_cast<std::ptrdiff_t>(i * slot_stride + slot_stride));
        which.push_back(i);
      }
      std::vector<uint16_t> out(which.size() * tile_stride, 0xBEEF);
      const BlockDecodeResult r = codec.decode_blocks(fitting.data(), slot_stride, which.size(), out.data(), row_stride, tile_stride);
      ASSERT_EQ(r.status, DecodeStatus::ok);
      ASSERT_EQ(r.index, which.size());
      for (size_t k = 0; k < which.size(); ++k) {
        for (size_t e = 0; e < tile_stride; ++e) {
          const size_t t = e / row_stride, c = e % row_stride;
          const bool element = t < kTileTokens && c < static_cast<size_t>(shape.channels);
          ASSERT_EQ(out[k * tile_stride + e], element ? src[which[k] * tile_stride + e] : 0xBEEF) << "tile " << k << " at " << e;
        }
      }
    }
  }
}

TEST(TileCodec, DecodeBlocksStopsAtTheFirstBadSlot) {
  const TileShape shape{TensorKind::value, 64};
  const test::TileCase tile = test::uniform_bases_tile(shape, 0, 0);  // zeros: every group 3-bit
  for (const Backend backend : available_backends()) {
    const TileCodec codec(shape, tile.bases(), 16, backend);
    std::vector<uint8_t> slots(3 * codec.slot_bytes());
    codec.encode_blocks(tile.elements.data(), 64, 0, 3, slots.data(), codec.slot_bytes(), nullptr);
    slots[2 * codec.slot_bytes() + shape.tag_offset()] = 0x03;  // tag 3 in the third slot
    slots[codec.slot_bytes() + shape.escape_offset() + 5] = 1;  // nonzero padding in the second
    std::vector<uint16_t> out(3 * tile.elements.size());
    const BlockDecodeResult r = codec.decode_blocks(slots.data(), codec.slot_bytes(), 3, out.data(), 64, tile.elements.size());
    EXPECT_EQ(r.index, 1u);
    EXPECT_EQ(r.status, DecodeStatus::nonzero_padding);
  }
}

/// encode_split writes a slot's bytes in two places (fixed part, escape slot), on every backend;
/// decode_split reads them back from there with an escape slot of any multiple of 16 that holds the
/// escapes, and rejects what decode_blocks rejects.
TEST(TileCodec, SplitCodingIsTheSlotInTwoPlaces) {
  std::mt19937_64 rng(23);
  for (const TileShape shape : test::all_shapes()) {
    for (int round = 0; round < 12; ++round) {
      const test::TileCase tile = test::random_tile(shape, rng, round % 3 == 0 ? 0.5 : 0.9, 0.08);
      const size_t most = shape.max_slot_capacity();
      for (const Backend backend : available_backends()) {
        const TileCodec codec(shape, tile.bases(), most, backend);
        std::vector<uint8_t> slot(codec.slot_bytes());
        TileEncoding whole;
        codec.encode_blocks(tile.elements.data(), static_cast<size_t>(shape.channels), 0, 1, slot.data(), 0, &whole);
        std::vector<uint8_t> fixed(shape.fixed_bytes() + 32, 0x5A), escapes(most + 32, 0x5A);
        const TileEncoding split =
            codec.encode_split(tile.elements.data(), static_cast<size_t>(shape.channels), fixed.data(), escapes.data());
        EXPECT_EQ(split.escape_bytes, whole.escape_bytes);
        EXPECT_EQ(split.fits, whole.fits);
        EXPECT_EQ(split.groups_by_mode, whole.groups_by_mode);
        for (size_t i = shape.fixed_bytes(); i < fixed.size(); ++i) ASSERT_EQ(fixed[i], 0x5A) << "written past the fixed part";
        for (size_t i = most; i < escapes.size(); ++i) ASSERT_EQ(escapes[i], 0x5A) << "written past the escape slot";
        if (!whole.fits) continue;
        EXPECT_TRUE(std::equal(fixed.begin(), fixed.begin() + static_cast<std::ptrdiff_t>(shape.fixed_bytes()), slot.begin()));
        EXPECT_TRUE(std::equal(escapes.begin(), escapes.begin() + static_cast<std::ptrdiff_t>(most),
                               slot.begin() + static_cast<std::ptrdiff_t>(shape.fixed_bytes())));
        // The smallest escape slot that holds the escapes, and the largest.
        const size_t tight = (split.escape_bytes + 15) / 16 * 16;
        for (const size_t capacity : {tight, most}) {
          std::vector<uint16_t> out(tile.elements.size(), 0xBEEF);
          ASSERT_EQ(codec.decode_split(fixed.data(), escapes.data(), capacity, out.data(), static_cast<size_t>(shape.channels)),
                    DecodeStatus::ok);
          EXPECT_EQ(out, tile.elements);
        }
        std::vector<uint16_t> out(tile.elements.size());
        if (split.escape_bytes >= 16) {
          EXPECT_EQ(codec.decode_split(fixed.data(), escapes.data(), tight - 16, out.data(), static_cast<size_t>(shape.channels)),
                    DecodeStatus::escape_overrun);
        }
        escapes[tight] = 1;  // a byte past the escapes, inside the slot given
        EXPECT_EQ(codec.decode_split(fixed.data(), escapes.data(), tight + 16, out.data(), static_cast<size_t>(shape.channels)),
                  DecodeStatus::nonzero_padding);
      }
    }
  }
}

TEST(CalibratedCodecs, CoverEveryTileOfACalibration) {
  const KvDump dump = make_synthetic_kv({.layers = 2, .kv_heads = 2, .head_dim = 256, .tokens = 48});
  const KvDump* dumps[] = {&dump};
  const CalibrationTable table = calibrate(dumps);
  const CalibratedCodecs calibrated(table);
  const CalibratedCodecs widest(table, TileShape{TensorKind::key, 128}.max_slot_capacity());
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(calibrated.tensor_codecs(kind, l).size(), 4u);  // 2 heads × 2 halves
      EXPECT_EQ(calibrated.codec(kind, l, 1, 1).escape_capacity(), table.escape_capacity(kind, l));
      EXPECT_EQ(widest.codec(kind, l, 0, 0).escape_capacity(), (TileShape{kind, 128}.max_slot_capacity()));
      // Codec (head 1, half 1) encodes a tile exactly as the table's bases for it do.
      const KvView v = view_of(dump.layers[static_cast<size_t>(l)].of(kind));
      const TilePosition p{2, 1, 1};
      std::vector<uint8_t> a(calibrated.codec(kind, l, 1, 1).slot_bytes()), b(a.size());
      TileEncoding ea;
      calibrated.codec(kind, l, 1, 1).encode_blocks(tile_origin(v, p), v.token_stride, 0, 1, a.data(), 0, &ea);
      const TileEncoding eb = encode_tile(tile_shape_for(kind, 256), tile_origin(v, p), v.token_stride,
                                          table.tile_bases(kind, l, 1, 1), table.escape_capacity(kind, l), b, Backend::scalar);
      EXPECT_EQ(ea.escape_bytes, eb.escape_bytes);
      if (eb.fits) {
        EXPECT_EQ(a, b);
      }
    }
  }
  EXPECT_THROW(calibrated.tensor_codecs(TensorKind::key, 2), Error);
}

}  // namespace
}  // namespace gaac
