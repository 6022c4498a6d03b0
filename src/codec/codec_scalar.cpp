// The scalar codec backend. It walks the tile element by element through the layout functions
// of gaac/format.hpp and favours plainness over speed: every other executor is tested against it.
#include <array>
#include <cstring>

#include "codec/group_scalar.hpp"
#include "codec/kernels.hpp"
#include "codec/shape_dispatch.hpp"

namespace gaac::scalar {
namespace {

using group::Group;

/// The BF16 windows: 3-bit offsets from b3, 4-bit from b4.
group::Windows<3> windows(const TileBases& bases) { return {bases.b3, bases.b4}; }

/// Writes bits 0..2 of `code` into the lane's code words at the position of (quad, byte).
void put_code(TileShape shape, uint32_t* words, int quad, int byte, uint32_t code) {
  const CodeBits where = code_bits(shape, quad);
  const uint32_t low_mask = (1u << where.low_bits) - 1;
  words[where.low_word] |= (code & low_mask) << (8 * byte + where.low_shift);
  if (where.high_word >= 0) words[where.high_word] |= ((code >> 2) & 1u) << (8 * byte + where.high_shift);
}

uint32_t get_code(TileShape shape, const uint32_t* words, int quad, int byte) {
  const CodeBits where = code_bits(shape, quad);
  const uint32_t low_mask = (1u << where.low_bits) - 1;
  uint32_t code = (words[where.low_word] >> (8 * byte + where.low_shift)) & low_mask;
  if (where.high_word >= 0) code |= ((words[where.high_word] >> (8 * byte + where.high_shift)) & 1u) << 2;
  return code;
}

TileEncoding encode_tile(TileShape shape, const uint16_t* src, size_t row_stride, const TileBases& bases,
                         size_t escape_capacity, uint8_t* slot, uint8_t* escapes) {
  TileEncoding result;
  std::memset(slot, 0, shape.fixed_bytes());
  std::memset(escapes, 0, escape_capacity);
  uint8_t* sign_mantissa = slot;
  uint8_t* codes = slot + shape.code_offset();
  uint8_t* tags = slot + shape.tag_offset();
  const int words_per_lane = code_words_per_lane(shape);
  group::TagWords tag_words(shape.groups());
  const group::Windows<3> window = windows(bases);
  size_t escape_used = 0;

  for (int lane = 0; lane < kWarpLanes; ++lane) {
    std::array<uint32_t, 6> words{};
    for (int pair = 0; pair < shape.groups_per_lane(); ++pair) {
      Group group;
      for (int q = 0; q < 2; ++q) {
        const int quad = 2 * pair + q;
        for (int b = 0; b < kQuadSize; ++b) {
          const ElementSlot at = element_slot(shape, lane, quad, b);
          const uint16_t x = src[static_cast<size_t>(at.token) * row_stride + at.channel];
          sign_mantissa[sign_mantissa_offset(lane, quad, b)] = bf16_sign_mantissa(x);
          group.exponent[index_in_group(quad, b)] = bf16_exponent(x);
          group.channel[index_in_group(quad, b)] = at.channel;
        }
      }
      const int mode = window.choose(group);
      tag_words.set(group_index(shape, lane, 2 * pair), mode);
      ++result.groups_by_mode[mode];

      // Offsets (or exponents, for raw groups) of the eight elements; low 3 bits go to the code words,
      // higher bits become escape bit-planes: plane k holds bit 3+k of element i at bit i.
      group::Planes<5> planes{};
      for (int i = 0; i < kGroupSize; ++i) {
        const auto offset = static_cast<uint32_t>(group.exponent[i] - window.base_for(mode, group.channel[i]));
        put_code(shape, words.data(), 2 * pair + i / kQuadSize, i % kQuadSize, offset);
        for (int k = 0; k < 5; ++k) planes[k] |= static_cast<uint8_t>(((offset >> (3 + k)) & 1u) << i);
      }
      group::put_planes(planes, escape_bytes_for(static_cast<GroupMode>(mode)), escapes, escape_capacity, escape_used);
    }
    for (int w = 0; w < words_per_lane; ++w) group::store_le32(codes + code_word_offset(shape, lane, w), words[w]);
  }
  tag_words.store(tags);
  result.escape_bytes = static_cast<uint32_t>(escape_used);
  result.fits = escape_used <= escape_capacity;
  return result;
}

DecodeStatus decode_tile(TileShape shape, const uint8_t* slot, const uint8_t* escapes, size_t escape_capacity,
                         const TileBases& bases, uint16_t* dst, size_t row_stride) {
  const uint8_t* sign_mantissa = slot;
  const uint8_t* codes = slot + shape.code_offset();
  const uint8_t* tags = slot + shape.tag_offset();
  const int words_per_lane = code_words_per_lane(shape);
  const group::Windows<3> window = windows(bases);
  size_t escape_next = 0;

  for (int lane = 0; lane < kWarpLanes; ++lane) {
    std::array<uint32_t, 6> words{};
    for (int w = 0; w < words_per_lane; ++w) words[w] = group::load_le32(codes + code_word_offset(shape, lane, w));
    for (int pair = 0; pair < shape.groups_per_lane(); ++pair) {
      const uint32_t tag = group::tag_of(tags, group_index(shape, lane, 2 * pair));
      if (tag == kInvalidTag) return DecodeStatus::invalid_tag;
      const auto mode = static_cast<int>(tag);
      const auto n_escape = static_cast<size_t>(escape_bytes_for(static_cast<GroupMode>(mode)));
      group::Planes<5> planes{};
      if (!group::take_planes(escapes, escape_capacity, n_escape, escape_next, planes)) return DecodeStatus::escape_overrun;

      for (int i = 0; i < kGroupSize; ++i) {
        const int quad = 2 * pair + i / kQuadSize;
        const int b = i % kQuadSize;
        uint32_t offset = get_code(shape, words.data(), quad, b);
        for (int k = 0; k < 5; ++k) offset |= ((planes[k] >> i) & 1u) << (3 + k);
        const ElementSlot at = element_slot(shape, lane, quad, b);
        // Calibrated bases keep base + offset inside 0..255; the cast is the format's definition.
        const auto exponent = static_cast<uint8_t>(window.base_for(mode, at.channel) + offset);
        dst[static_cast<size_t>(at.token) * row_stride + at.channel] =
            bf16_compose(sign_mantissa[sign_mantissa_offset(lane, quad, b)], exponent);
      }
    }
  }
  return group::padding_is_zero(escapes, escape_next, escape_capacity) ? DecodeStatus::ok : DecodeStatus::nonzero_padding;
}

/// Prepared bases of the scalar backend: b3 of every channel, then b4.
template <int Channels>
TileBases unprepare(const uint8_t* prepared) {
  return {{prepared, Channels}, {prepared + Channels, Channels}};
}

}  // namespace

detail::ShapeKernels kernels(TileShape shape) {
  return detail::dispatch_shape(shape, []<TensorKind Kind, int Channels>() {
    return detail::ShapeKernels{
        [](const TileBases& bases, uint8_t* prepared) {
          std::memcpy(prepared, bases.b3.data(), Channels);
          std::memcpy(prepared + Channels, bases.b4.data(), Channels);
        },
        [](const uint8_t* prepared, const uint16_t* src, size_t row_stride, size_t capacity, uint8_t* slot,
           uint8_t* escapes) {
          return encode_tile(TileShape{Kind, Channels}, src, row_stride, unprepare<Channels>(prepared), capacity, slot,
                             escapes);
        },
        [](const uint8_t* prepared, const uint8_t* slot, const uint8_t* escapes, size_t capacity, uint16_t* dst,
           size_t row_stride) {
          return decode_tile(TileShape{Kind, Channels}, slot, escapes, capacity, unprepare<Channels>(prepared), dst,
                             row_stride);
        }};
  });
}

}  // namespace gaac::scalar
