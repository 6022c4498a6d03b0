// The scalar FP8 codec backend. It walks the tile element by element through the layout functions of
// gaac/fp8_format.hpp and favours plainness over speed: every other FP8 executor is tested against it.
#include <array>
#include <cstring>

#include "codec/fp8_kernels.hpp"
#include "codec/group_scalar.hpp"

namespace gaac::scalar {
namespace {

/// Writes the `bits`-bit field of fragment position `position` into a stream (zeroed beforehand).
void put_field(uint8_t* stream, int bits, int position, uint32_t value) {
  const StreamField at = stream_field(bits, position);
  stream[at.byte] = static_cast<uint8_t>(stream[at.byte] | (value & ((1u << bits) - 1)) << at.shift);
}

uint32_t get_field(const uint8_t* stream, int bits, int position) {
  const StreamField at = stream_field(bits, position);
  return (stream[at.byte] >> at.shift) & ((1u << bits) - 1);
}

/// The sign+mantissa field of a position: E4M3 one 4-bit stream, E5M2 a 1-bit stream of signs and a
/// 2-bit stream of mantissas.
void put_sign_mantissa(Fp8TileShape shape, uint8_t* slot, int position, uint8_t sm) {
  if (shape.format == ElementFormat::e4m3) {
    put_field(slot + shape.sign_mantissa_offset(), 4, position, sm);
  } else {
    put_field(slot + shape.sign_mantissa_offset(), 1, position, sm >> 2);
    put_field(slot + shape.mantissa_offset(), 2, position, sm & 3u);
  }
}

uint8_t get_sign_mantissa(Fp8TileShape shape, const uint8_t* slot, int position) {
  if (shape.format == ElementFormat::e4m3) return static_cast<uint8_t>(get_field(slot + shape.sign_mantissa_offset(), 4, position));
  return static_cast<uint8_t>(get_field(slot + shape.sign_mantissa_offset(), 1, position) << 2 |
                              get_field(slot + shape.mantissa_offset(), 2, position));
}

using group::Group;

/// The FP8 windows: 2-bit offsets from b2, 3-bit from b3.
group::Windows<2> windows(const Fp8TileBases& bases) { return {bases.b2, bases.b3}; }

TileEncoding encode_tile(Fp8TileShape shape, const uint8_t* src, size_t row_stride, const Fp8TileBases& bases,
                         size_t escape_capacity, uint8_t* slot) {
  TileEncoding result;
  std::memset(slot, 0, shape.slot_bytes(escape_capacity));
  uint8_t* codes = slot + shape.code_offset();
  uint8_t* escapes = slot + shape.escape_offset();
  group::TagWords tag_words(shape.groups());
  const group::Windows<2> window = windows(bases);
  size_t escape_used = 0;

  for (int lane = 0; lane < kWarpLanes; ++lane) {
    for (int pair = 0; pair < shape.tile.groups_per_lane(); ++pair) {
      Group group;
      for (int i = 0; i < kGroupSize; ++i) {
        const int quad = 2 * pair + i / kQuadSize, b = i % kQuadSize;
        const ElementSlot at = element_slot(shape.tile, lane, quad, b);
        const uint8_t x = src[static_cast<size_t>(at.token) * row_stride + at.channel];
        put_sign_mantissa(shape, slot, fragment_position(lane, quad, b), fp8_sign_mantissa(x, shape.format));
        group.exponent[i] = fp8_exponent(x, shape.format);
        group.channel[i] = at.channel;
      }
      const int mode = window.choose(group);
      tag_words.set(group_index(shape.tile, lane, 2 * pair), mode);
      ++result.groups_by_mode[mode];

      // Offsets (exponents, for raw groups): the low two bits go to the code stream, bit 2 + k to
      // escape plane k at bit i for element i.
      group::Planes<3> planes{};
      for (int i = 0; i < kGroupSize; ++i) {
        const auto offset = static_cast<uint32_t>(group.exponent[i] - window.base_for(mode, group.channel[i]));
        put_field(codes, kFp8CodeBits, fragment_position(lane, 2 * pair + i / kQuadSize, i % kQuadSize), offset);
        for (int k = 0; k < 3; ++k) planes[k] = static_cast<uint8_t>(planes[k] | ((offset >> (kFp8CodeBits + k)) & 1u) << i);
      }
      group::put_planes(planes, fp8_escape_bytes_for(static_cast<Fp8GroupMode>(mode), shape.format), escapes, escape_capacity,
                        escape_used);
    }
  }
  tag_words.store(slot + shape.tag_offset());
  result.escape_bytes = static_cast<uint32_t>(escape_used);
  result.fits = escape_used <= escape_capacity;
  return result;
}

DecodeStatus decode_tile(Fp8TileShape shape, const uint8_t* slot, size_t escape_capacity, const Fp8TileBases& bases,
                         uint8_t* dst, size_t row_stride) {
  const uint8_t* codes = slot + shape.code_offset();
  const uint8_t* tags = slot + shape.tag_offset();
  const uint8_t* escapes = slot + shape.escape_offset();
  const group::Windows<2> window = windows(bases);
  size_t escape_next = 0;

  for (int lane = 0; lane < kWarpLanes; ++lane) {
    for (int pair = 0; pair < shape.tile.groups_per_lane(); ++pair) {
      const uint32_t tag = group::tag_of(tags, group_index(shape.tile, lane, 2 * pair));
      if (tag == kInvalidTag) return DecodeStatus::invalid_tag;
      const auto mode = static_cast<int>(tag);
      const auto n_escape = static_cast<size_t>(fp8_escape_bytes_for(static_cast<Fp8GroupMode>(mode), shape.format));
      group::Planes<3> planes{};
      if (!group::take_planes(escapes, escape_capacity, n_escape, escape_next, planes)) return DecodeStatus::escape_overrun;

      for (int i = 0; i < kGroupSize; ++i) {
        const int quad = 2 * pair + i / kQuadSize, b = i % kQuadSize;
        const int position = fragment_position(lane, quad, b);
        uint32_t offset = get_field(codes, kFp8CodeBits, position);
        for (int k = 0; k < 3; ++k) offset |= ((planes[k] >> i) & 1u) << (kFp8CodeBits + k);
        const ElementSlot at = element_slot(shape.tile, lane, quad, b);
        // Calibrated bases keep base + offset inside the exponent range; the cast is the format's definition.
        const auto exponent = static_cast<uint8_t>(window.base_for(mode, at.channel) + offset);
        dst[static_cast<size_t>(at.token) * row_stride + at.channel] =
            fp8_compose(get_sign_mantissa(shape, slot, position), exponent, shape.format);
      }
    }
  }
  return group::padding_is_zero(escapes, escape_next, escape_capacity) ? DecodeStatus::ok : DecodeStatus::nonzero_padding;
}

/// Prepared bases of the scalar backend: b2 of every channel, then b3.
template <int Channels>
Fp8TileBases unprepare(const uint8_t* prepared) {
  return {{prepared, Channels}, {prepared + Channels, Channels}};
}

}  // namespace

detail::Fp8ShapeKernels fp8_kernels(Fp8TileShape shape) {
  return detail::dispatch_fp8_shape(shape, []<ElementFormat Format, TensorKind Kind, int Channels>() {
    return detail::Fp8ShapeKernels{
        [](const Fp8TileBases& bases, uint8_t* prepared) {
          std::memcpy(prepared, bases.b2.data(), Channels);
          std::memcpy(prepared + Channels, bases.b3.data(), Channels);
        },
        [](const uint8_t* prepared, const uint8_t* src, size_t row_stride, size_t capacity, uint8_t* slot) {
          return encode_tile(Fp8TileShape{Format, TileShape{Kind, Channels}}, src, row_stride, unprepare<Channels>(prepared), capacity, slot);
        },
        [](const uint8_t* prepared, const uint8_t* slot, size_t capacity, uint8_t* dst, size_t row_stride) {
          return decode_tile(Fp8TileShape{Format, TileShape{Kind, Channels}}, slot, capacity, unprepare<Channels>(prepared), dst, row_stride);
        }};
  });
}

}  // namespace gaac::scalar
