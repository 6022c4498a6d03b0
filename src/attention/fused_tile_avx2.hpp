// A compressed tile opened for the fused AVX2 kernels: its tags read, its 4-bit escapes placed, and
// the exponents of the groups the decoder's vector pass gets wrong (raw groups, and 4-bit groups
// after a raw group in their row) computed once in scalar code, so that every fragment register's
// exponents come out right where the register is composed. The decoder patches those groups in its
// output after the vector pass; a fused kernel consumes the values as they are made and cannot.
//
// Built from codec/decode_avx2.hpp, the decoder's own parts; include only from files built with
// -mavx2 -mbmi2 (and, for the kernels, -mfma).
#pragma once

#include <cstring>
#include <new>
#include <type_traits>

#include "codec/decode_avx2.hpp"
#include "gaac/tile_codec.hpp"

namespace gaac::avx2 {
namespace {

/// Position, in the decoder's order of a register, of fragment dword `fragment`.
template <class G>
constexpr int decode_dword_of(int fragment) {
  for (int d = 0; d < 8; ++d) {
    if (fragment_dword<G>(d) == fragment) return d;
  }
  return -1;
}

/// Replacement exponents for whole groups, per fragment register: where mask_[v] is set, register
/// v's exponents are value_[v]. Only the registers named in `registers()` are initialised.
template <class G>
class GroupOverrides {
 public:
  static constexpr int kRegisters = G::kElements / 32;
  static_assert(kRegisters <= 64);

  /// The group at fragment offset `at` has exponents `exponents` (byte e: element e).
  void add(int at, uint64_t exponents) {
    const int v = at / 32, first = at % 32 / 4;  // the group is fragment dwords first, first + 1 of v
    if ((registers_ >> v & 1) == 0) {
      registers_ |= uint64_t{1} << v;
      std::memset(value_[v], 0, sizeof value_[v]);
      std::memset(mask_[v], 0, sizeof mask_[v]);
    }
    for (int k = 0; k < 2; ++k) {
      const int d = decode_dword_of<G>(first + k);
      const auto four = static_cast<uint32_t>(exponents >> (32 * k));
      std::memcpy(value_[v] + 4 * d, &four, sizeof four);
      std::memset(mask_[v] + 4 * d, 0xFF, 4);
    }
  }

  /// Bit v: register v has replacements.
  uint64_t registers() const { return registers_; }

  /// The exponents of register v (decode order) with its replacements applied.
  __m256i apply(int v, __m256i exponents) const {
    if ((registers_ >> v & 1) == 0) return exponents;
    return _mm256_blendv_epi8(exponents, load(value_[v]), load(mask_[v]));
  }

 private:
  uint64_t registers_ = 0;
  alignas(32) uint8_t value_[kRegisters][32];
  alignas(32) uint8_t mask_[kRegisters][32];
};

/// The exponents of an open tile's fragment registers, as Exponents<G> makes them, with the group
/// replacements applied when kPatched (tiles with a raw group; the others skip the test).
template <class G, bool kPatched>
class TileExponents {
 public:
  TileExponents(const Exponents<G>& exponents, const GroupOverrides<G>& overrides)
      : exponents_(exponents), overrides_(overrides) {}

  /// Fragment register 16c + p, chunk c = 2o + kOdd, in decode order.
  template <int kOdd>
  __m256i get(int o, int p) const {
    const __m256i e = exponents_.template get<kOdd>(o, p);
    if constexpr (kPatched) return overrides_.apply(16 * (2 * o + kOdd) + p, e);
    return e;
  }

 private:
  Exponents<G> exponents_;
  const GroupOverrides<G>& overrides_;
};

/// One compressed slot ready to be composed register by register. The slot must be a valid one (a
/// cache's own): nothing is validated. Not copyable (it points into itself).
template <class G>
class OpenTile {
 public:
  OpenTile(const TileCodec& codec, const uint8_t* slot) : slot_(slot) {
    // The AVX2 backend prepared the bases in the decoder's order; another backend's codec gets them
    // prepared here.
    if (codec.backend() == Backend::avx2) {
      bases_ = &std::launder(reinterpret_cast<const PreparedBases<G>*>(codec.prepared()))->decode;
    } else {
      bases_ = new (own_bases_) DecodeBases<G>(codec.bases());
    }
    const uint8_t* tags = slot + G::kShape.tag_offset();
    const uint8_t* escapes = slot + G::kShape.escape_offset();
    read_tag_rows(tags, codec.escape_capacity(), rows_);
    if (rows_.used != 0) find_escape_rows(tags, escapes, rows_, escape_rows_);
    for_each_escaped_group(slot, escapes, *bases_, rows_, [&](int at, int, int, uint64_t exponents) { overrides_.add(at, exponents); });
  }
  OpenTile(const OpenTile&) = delete;
  OpenTile& operator=(const OpenTile&) = delete;

  /// The slot; its first section, the stored bytes, is what the words are composed from.
  const uint8_t* slot() const { return slot_; }
  /// True when some group's exponents are replaced (the tile has a raw group).
  bool patched() const { return overrides_.registers() != 0; }
  /// The exponents of every fragment register; kPatched must be true when patched() is.
  template <bool kPatched>
  TileExponents<G, kPatched> exponents() const {
    const Exponents<G> plain(slot_ + G::kShape.code_offset(), *bases_, rows_.used != 0 ? escape_rows_ : kNoEscapes<G>);
    return TileExponents<G, kPatched>(plain, overrides_);
  }

 private:
  static_assert(std::is_trivially_destructible_v<DecodeBases<G>>);
  const uint8_t* slot_;
  const DecodeBases<G>* bases_ = nullptr;
  // Storage for bases prepared here. Not a std::optional: GCC zeroes an optional's whole storage when
  // it is default-constructed (2 KB for value tiles), on every tile.
  alignas(32) unsigned char own_bases_[sizeof(DecodeBases<G>)];
  TagRows<G> rows_;
  EscapeRows<G> escape_rows_;
  GroupOverrides<G> overrides_;
};

}  // namespace
}  // namespace gaac::avx2
