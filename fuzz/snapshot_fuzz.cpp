// libFuzzer target: arbitrary bytes as a .gaac snapshot image, BF16 or FP8. gaac::parse_any_snapshot must
// either return a snapshot or throw gaac::Error; a crash, a sanitizer report or any other exception is a bug.
//
// Each input is parsed twice: as it is, and "fixed up" (magic, versions and file size set, every
// XXH64 recomputed, see fixed_up()), so that mutations get past the checksums to the validation of
// the section table, the metadata, the calibration and every slot. An accepted image must survive
// a round trip: written again with gaac::snapshot_image, it parses to the same dump.
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <variant>
#include <vector>

#include "gaac/error.hpp"
#include "gaac/snapshot.hpp"

namespace {

constexpr size_t kHeaderBytes = 32;
constexpr size_t kEntryBytes = 32;
constexpr uint8_t kMagic[8] = {0x89, 'G', 'A', 'A', 'C', '\r', '\n', 0x1A};

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

/// The input with a valid header and every checksum that can be computed recomputed
/// (layout in src/io/snapshot.cpp: 32-byte header, then 32-byte entries type, index, offset, bytes, xxh64).
std::vector<uint8_t> fixed_up(std::span<const uint8_t> input) {
  std::vector<uint8_t> image(input.begin(), input.end());
  if (image.size() < kHeaderBytes) return image;
  std::copy(std::begin(kMagic), std::end(kMagic), image.begin());
  put_le(&image[8], gaac::kSnapshotVersion, 2);
  put_le(&image[10], gaac::kTileFormatVersion, 2);
  put_le(&image[16], image.size(), 8);
  const uint64_t count = std::min<uint64_t>(get_le(&image[12], 4), (image.size() - kHeaderBytes) / kEntryBytes);
  for (uint64_t i = 0; i < count; ++i) {
    uint8_t* e = &image[kHeaderBytes + i * kEntryBytes];
    const uint64_t offset = get_le(e + 8, 8);
    const uint64_t bytes = get_le(e + 16, 8);
    if (offset <= image.size() && bytes <= image.size() - offset) put_le(e + 24, XXH64(image.data() + offset, bytes, 0), 8);
  }
  put_le(&image[24], XXH64(image.data() + kHeaderBytes, count * kEntryBytes, 0), 8);
  return image;
}

template <class Dump>
bool same_dump(const Dump& a, const Dump& b) {
  if (a.layers.size() != b.layers.size() || a.metadata != b.metadata) return false;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    for (const gaac::TensorKind kind : {gaac::TensorKind::key, gaac::TensorKind::value}) {
      const auto& x = a.layers[l].of(kind);
      const auto& y = b.layers[l].of(kind);
      if (x.tokens != y.tokens || x.kv_heads != y.kv_heads || x.head_dim != y.head_dim || x.data != y.data) return false;
    }
  }
  if constexpr (std::is_same_v<Dump, gaac::Fp8KvDump>) {
    if (a.format != b.format || a.k_scales != b.k_scales || a.v_scales != b.v_scales) return false;
  }
  return true;
}

void parse_one(std::span<const uint8_t> image) {
  gaac::AnySnapshot snapshot;
  try {
    snapshot = gaac::parse_any_snapshot(image, "fuzz");
  } catch (const gaac::Error&) {
    return;  // rejected: the usual outcome
  }
  // Accepted: the snapshot must be consistent enough to be written again (a gaac::Error here is
  // not caught, so it aborts), and the new image must read back the same.
  std::visit(
      [](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        const std::vector<uint8_t> again = gaac::snapshot_image(s.dump, s.calibration);
        const gaac::AnySnapshot back = gaac::parse_any_snapshot(again, "fuzz rewrite");
        if (!std::holds_alternative<S>(back) || !same_dump(s.dump, std::get<S>(back).dump)) __builtin_trap();
      },
      snapshot);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> input(data, size);
  parse_one(input);
  parse_one(fixed_up(input));
  return 0;
}
