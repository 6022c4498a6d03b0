// Uses the C and the C++ API of an installed gaac, linked as the shared library (only its exported
// symbols): exits 0 when a tile round-trips through both APIs and a TileCodec, and a synthetic dump
// round-trips through a snapshot.
#include <gaac/calibration.hpp>
#include <gaac/codec.hpp>
#include <gaac/tile_codec.hpp>
#include <gaac/gaac.h>
#include <gaac/snapshot.hpp>
#include <gaac/synthetic.hpp>

#include <cstdio>
#include <vector>

int main() {
  const gaac::TileShape shape{gaac::TensorKind::key, 128};
  std::vector<uint16_t> src(static_cast<size_t>(shape.elements())), dst(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(0x3F00 + i % 64);
  std::vector<uint8_t> b3(128, 120), b4(128, 116), slot(shape.slot_bytes(64));
  const auto enc = gaac::encode_tile(shape, src.data(), 128, {b3, b4}, 64, slot);
  const auto status = gaac::decode_tile(shape, slot, 64, {b3, b4}, dst.data(), 128);
  bool ok = enc.fits && status == gaac::DecodeStatus::ok && src == dst;

  const gaac::TileCodec codec(shape, {b3, b4}, 64);
  std::vector<uint16_t> again(src.size());
  ok = ok && codec.decode_blocks(slot.data(), 0, 1, again.data(), 128, 0).status == gaac::DecodeStatus::ok && again == src;

  gaac::SyntheticKvSpec spec;
  spec.layers = 2;
  spec.tokens = 40;
  const gaac::KvDump dump = gaac::make_synthetic_kv(spec);
  const gaac::KvDump* dumps[] = {&dump};
  const gaac::CalibrationTable table = gaac::calibrate(dumps);
  const gaac::Snapshot back = gaac::parse_snapshot(gaac::snapshot_image(dump, table), "in memory");
  ok = ok && back.dump.layers.size() == 2 && back.dump.layers[1].v.data == dump.layers[1].v.data;

  std::printf("gaac %s consumer: %s\n", gaac_version_string(), ok ? "round trips ok" : "round trip FAILED");
  return ok ? 0 : 1;
}
