// Uses both the C and the C++ API of an installed gaac; exits 0 when a tile round-trips.
#include <gaac/codec.hpp>
#include <gaac/gaac.h>

#include <cstdio>
#include <vector>

int main() {
  const gaac::TileShape shape{gaac::TensorKind::key, 128};
  std::vector<uint16_t> src(static_cast<size_t>(shape.elements())), dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(0x3F00 + i % 64);
  std::vector<uint8_t> b3(128, 120), b4(128, 116), slot(shape.slot_bytes(64));
  const auto enc = gaac::encode_tile(shape, src.data(), 128, {b3, b4}, 64, slot);
  const auto status = gaac::decode_tile(shape, slot, 64, {b3, b4}, dst.data(), 128);
  const bool ok = enc.fits && status == gaac::DecodeStatus::ok && src == dst;
  std::printf("gaac %s consumer: %s\n", gaac_version_string(), ok ? "round trip ok" : "round trip FAILED");
  return ok ? 0 : 1;
}
