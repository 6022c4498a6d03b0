// libFuzzer target: arbitrary bytes as one compressed slot, BF16 or FP8, decoded by every backend.
//
// Input: a 6-byte header, then the slot (zero-padded or truncated to the slot size):
//   byte 0  bit 0: kind (0 key, 1 value); bit 1: width (0 → 64 channels, 1 → 128);
//           bits 2..3: element format (0 BF16, 1 E4M3, 2 E5M2, 3 BF16);
//           bits 4..7: extra row stride in elements (0..15) of the destination
//   byte 1  escape capacity in units of 16 bytes (modulo the number of valid capacities)
//   byte 2  narrow base of channel 0; byte 4: its step per channel (BF16 b3: (byte2 + c·byte4) mod 249;
//           FP8 b2: mod 2^X − 3)
//   byte 3  wide base of channel 0; byte 5: its step per channel (BF16 b4: mod 241; FP8 b3: mod 2^X − 7)
// fuzz/make_corpus.cpp writes seeds in this format.
//
// Properties (a violation calls __builtin_trap()):
//   * the scalar backend and, when this machine has it, the AVX2 path return the same status and,
//     on success, the same elements;
//   * no backend writes outside the tile's columns of the destination;
//   * a successfully decoded tile re-encodes (same bases, same capacity) into a slot that fits, every
//     backend produces the same slot bytes, and decoding that slot gives the same elements again.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gaac/codec.hpp"
#include "gaac/format.hpp"
#include "gaac/fp8_codec.hpp"

namespace {

using gaac::Backend;
using gaac::DecodeStatus;

constexpr size_t kInputHeader = 6;
constexpr uint16_t kSentinel = 0xA5A5;

void check(bool condition) {
  if (!condition) __builtin_trap();
}

struct Decoded {
  DecodeStatus status;
  std::vector<uint16_t> dst;  // 16 rows of `stride` elements
};

Decoded decode(gaac::TileShape shape, std::span<const uint8_t> slot, size_t capacity, const gaac::TileBases& bases,
               size_t stride, Backend backend) {
  Decoded d{DecodeStatus::ok, std::vector<uint16_t>(gaac::kTileTokens * stride, kSentinel)};
  d.status = gaac::decode_tile(shape, slot, capacity, bases, d.dst.data(), stride, backend);
  // Columns past the tile's width belong to someone else: untouched whatever the status.
  for (int row = 0; row < gaac::kTileTokens; ++row) {
    for (size_t c = static_cast<size_t>(shape.channels); c < stride; ++c) check(d.dst[row * stride + c] == kSentinel);
  }
  return d;
}

bool same_tile(const Decoded& a, const Decoded& b, gaac::TileShape shape, size_t stride) {
  for (int row = 0; row < gaac::kTileTokens; ++row) {
    for (int c = 0; c < shape.channels; ++c) {
      if (a.dst[row * stride + static_cast<size_t>(c)] != b.dst[row * stride + static_cast<size_t>(c)]) return false;
    }
  }
  return true;
}

/// The FP8 properties (the same as BF16's below, on FP8 bytes).
void fuzz_fp8(const uint8_t* data, size_t size, gaac::Fp8TileShape shape, size_t stride) {
  constexpr uint8_t kByteSentinel = 0xA5;
  const auto channels = static_cast<size_t>(shape.tile.channels);
  const size_t capacity = data[1] % (shape.max_slot_capacity() / gaac::kSlotAlignment + 1) * gaac::kSlotAlignment;
  std::array<uint8_t, gaac::kMaxTileChannels> b2{}, b3{};
  for (size_t c = 0; c < channels; ++c) {
    b2[c] = static_cast<uint8_t>((data[2] + c * data[4]) % static_cast<size_t>(gaac::fp8_max_base2(shape.format) + 1));
    b3[c] = static_cast<uint8_t>((data[3] + c * data[5]) % static_cast<size_t>(gaac::fp8_max_base3(shape.format) + 1));
  }
  const gaac::Fp8TileBases bases{std::span(b2).first(channels), std::span(b3).first(channels)};
  std::vector<uint8_t> slot(shape.slot_bytes(capacity), 0);  // exactly its size, for AddressSanitizer
  std::copy_n(data + kInputHeader, std::min(size - kInputHeader, slot.size()), slot.begin());
  const auto decode = [&](std::span<const uint8_t> s, Backend backend, std::vector<uint8_t>& dst) {
    dst.assign(gaac::kTileTokens * stride, kByteSentinel);
    const DecodeStatus status = gaac::decode_fp8_tile(shape, s, capacity, bases, dst.data(), stride, backend);
    for (int row = 0; row < gaac::kTileTokens; ++row) {
      for (size_t c = channels; c < stride; ++c) check(dst[row * stride + c] == kByteSentinel);
    }
    return status;
  };
  const auto same = [&](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    for (int row = 0; row < gaac::kTileTokens; ++row) {
      if (!std::equal(a.begin() + row * stride, a.begin() + row * stride + channels, b.begin() + row * stride)) return false;
    }
    return true;
  };
  std::vector<uint8_t> scalar, fast;
  const DecodeStatus status = decode(slot, Backend::scalar, scalar);
  const bool have_avx2 = gaac::backend_available(Backend::avx2);
  if (have_avx2) {
    check(decode(slot, Backend::avx2, fast) == status);
    if (status == DecodeStatus::ok) check(same(fast, scalar));
  }
  if (status != DecodeStatus::ok) return;
  // Re-encode: a decoded group needs at most the escapes its tag asked for, so the tile fits again.
  std::vector<uint8_t> again(slot.size(), 0xEE);
  const gaac::TileEncoding enc = gaac::encode_fp8_tile(shape, scalar.data(), stride, bases, capacity, again, Backend::scalar);
  check(enc.fits && enc.escape_bytes <= capacity);
  if (have_avx2) {
    std::vector<uint8_t> other(slot.size(), 0x11);
    const gaac::TileEncoding e = gaac::encode_fp8_tile(shape, scalar.data(), stride, bases, capacity, other, Backend::avx2);
    check(other == again && e.groups_by_mode == enc.groups_by_mode && e.escape_bytes == enc.escape_bytes);
  }
  for (const Backend backend : {Backend::scalar, Backend::avx2}) {
    if (!gaac::backend_available(backend)) continue;
    std::vector<uint8_t> round;
    check(decode(again, backend, round) == DecodeStatus::ok);
    check(same(round, scalar));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < kInputHeader) return 0;
  const gaac::TileShape shape{(data[0] & 1) ? gaac::TensorKind::value : gaac::TensorKind::key,
                              (data[0] & 2) ? 128 : 64};
  const size_t stride = static_cast<size_t>(shape.channels) + (data[0] >> 4);
  const int format = data[0] >> 2 & 3;
  if (format == 1 || format == 2) {
    fuzz_fp8(data, size, {format == 1 ? gaac::ElementFormat::e4m3 : gaac::ElementFormat::e5m2, shape}, stride);
    return 0;
  }
  const size_t capacities = shape.max_slot_capacity() / gaac::kSlotAlignment + 1;
  const size_t capacity = data[1] % capacities * gaac::kSlotAlignment;
  std::array<uint8_t, gaac::kMaxTileChannels> b3{}, b4{};
  for (int c = 0; c < shape.channels; ++c) {
    b3[static_cast<size_t>(c)] = static_cast<uint8_t>((data[2] + c * data[4]) % (gaac::kMaxBase3 + 1));
    b4[static_cast<size_t>(c)] = static_cast<uint8_t>((data[3] + c * data[5]) % (gaac::kMaxBase4 + 1));
  }
  const gaac::TileBases bases{std::span(b3).first(static_cast<size_t>(shape.channels)),
                              std::span(b4).first(static_cast<size_t>(shape.channels))};

  // The slot gets a buffer of exactly its size, so AddressSanitizer sees any read past its end.
  std::vector<uint8_t> slot(shape.slot_bytes(capacity), 0);
  const size_t given = std::min(size - kInputHeader, slot.size());
  std::copy_n(data + kInputHeader, given, slot.begin());

  const Decoded scalar = decode(shape, slot, capacity, bases, stride, Backend::scalar);
  const bool have_avx2 = gaac::backend_available(Backend::avx2);
  if (have_avx2) {
    const Decoded fast = decode(shape, slot, capacity, bases, stride, Backend::avx2);
    check(fast.status == scalar.status);
    if (scalar.status == DecodeStatus::ok) check(same_tile(fast, scalar, shape, stride));
  }
  if (scalar.status != DecodeStatus::ok) return 0;

  // Re-encode what was decoded. Every group needs at most the escape bytes its tag asked for (a
  // decoded 3-bit group is 3-bit again, a 4-bit one 3- or 4-bit), so the tile fits the same slot.
  std::vector<uint8_t> again(slot.size(), 0xEE);
  const gaac::TileEncoding enc =
      gaac::encode_tile(shape, scalar.dst.data(), stride, bases, capacity, again, Backend::scalar);
  check(enc.fits);
  check(enc.escape_bytes <= capacity);
  check(enc.groups_by_mode[0] + enc.groups_by_mode[1] + enc.groups_by_mode[2] == static_cast<uint32_t>(shape.groups()));
  if (have_avx2) {
    std::vector<uint8_t> fast(slot.size(), 0x11);
    const gaac::TileEncoding fast_enc =
        gaac::encode_tile(shape, scalar.dst.data(), stride, bases, capacity, fast, Backend::avx2);
    check(fast == again);
    check(fast_enc.groups_by_mode == enc.groups_by_mode && fast_enc.escape_bytes == enc.escape_bytes &&
          fast_enc.fits == enc.fits);
  }
  for (const Backend backend : {Backend::scalar, Backend::avx2}) {
    if (!gaac::backend_available(backend)) continue;
    const Decoded round = decode(shape, again, capacity, bases, stride, backend);
    check(round.status == DecodeStatus::ok);
    check(same_tile(round, scalar, shape, stride));
  }
  return 0;
}
