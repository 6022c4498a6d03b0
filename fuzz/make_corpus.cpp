// Seed corpus for the fuzz targets, so that fuzzing starts from valid inputs:
//
//   gaac_fuzz_corpus <snapshot_dir> <tile_dir> [<safetensors_dir>]
//
// writes small valid .gaac images (gaac_snapshot_fuzz), valid tile slots behind the 6-byte header
// that fuzz/tile_decode_fuzz.cpp describes (gaac_tile_decode_fuzz) and, when a third directory is
// given, a KV dump and a calibration table as safetensors (gaac_safetensors_fuzz). Deterministic:
// the same files every run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/snapshot.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"

namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

/// A synthetic dump whose layer l has tokens[l] tokens.
gaac::KvDump dump_of(int heads, int head_dim, const std::vector<int>& tokens, uint64_t seed) {
  int most = 0;
  for (const int t : tokens) most = std::max(most, t);
  gaac::KvDump dump = gaac::make_synthetic_kv(
      {.layers = static_cast<int>(tokens.size()), .kv_heads = heads, .head_dim = head_dim, .tokens = most, .seed = seed});
  for (size_t l = 0; l < tokens.size(); ++l) {
    for (gaac::KvTensor* t : {&dump.layers[l].k, &dump.layers[l].v}) {
      t->tokens = tokens[l];
      t->data.resize(t->elements());
    }
  }
  return dump;
}

gaac::CalibrationTable calibrated(const gaac::KvDump& dump) {
  const gaac::KvDump* dumps[] = {&dump};
  return gaac::calibrate(dumps);
}

int write_snapshots(const fs::path& dir) {
  int n = 0;
  auto emit = [&](const std::string& name, const gaac::KvDump& dump, const gaac::CalibrationTable& table) {
    write_file(dir / (name + ".gaac"), gaac::snapshot_image(dump, table));
    ++n;
  };
  {  // One tile and a one-token tail.
    const auto dump = dump_of(1, 64, {17}, 1);
    emit("one_tile_64", dump, calibrated(dump));
  }
  {  // Two layers, one of them empty; wider tiles.
    const auto dump = dump_of(1, 128, {20, 0}, 2);
    emit("two_layers_128", dump, calibrated(dump));
  }
  {  // Half-head tiles.
    const auto dump = dump_of(1, 256, {16}, 3);
    emit("half_heads_256", dump, calibrated(dump));
  }
  {  // Capacity 0: tiles fall back to raw storage.
    const auto dump = dump_of(2, 64, {32}, 4);
    auto table = calibrated(dump);
    table.set_escape_capacity(gaac::TensorKind::key, 0, 0);
    table.set_escape_capacity(gaac::TensorKind::value, 0, 0);
    emit("raw_fallback_64", dump, table);
  }
  {  // Only tail tokens, with metadata.
    auto dump = dump_of(2, 64, {5, 3}, 5);
    dump.metadata = {{"source", "gaac_fuzz_corpus"}, {"model", "none"}};
    auto table = calibrated(dump);
    table.metadata()["note"] = "seed";
    emit("tail_only_64", dump, table);
  }
  return n;
}

/// One tile-fuzz input: header, then the slot of a random tile with the header's bases.
std::vector<uint8_t> tile_input(gaac::TileShape shape, size_t capacity, uint8_t stride_extra, uint8_t base3,
                                uint8_t base4, uint8_t step3, uint8_t step4, double p3, std::mt19937_64& rng) {
  std::vector<uint8_t> b3(static_cast<size_t>(shape.channels)), b4(b3.size());
  for (int c = 0; c < shape.channels; ++c) {
    b3[static_cast<size_t>(c)] = static_cast<uint8_t>((base3 + c * step3) % (gaac::kMaxBase3 + 1));
    b4[static_cast<size_t>(c)] = static_cast<uint8_t>((base4 + c * step4) % (gaac::kMaxBase4 + 1));
  }
  std::vector<uint16_t> tile(static_cast<size_t>(shape.elements()));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int t = 0; t < gaac::kTileTokens; ++t) {
    for (int c = 0; c < shape.channels; ++c) {
      const double r = u(rng);
      const int e = r < p3 ? b3[static_cast<size_t>(c)] + static_cast<int>(rng() % 8)
                    : r < p3 + (1 - p3) / 2 ? b4[static_cast<size_t>(c)] + static_cast<int>(rng() % 16)
                                            : static_cast<int>(rng() % 256);
      tile[static_cast<size_t>(t * shape.channels + c)] =
          static_cast<uint16_t>((rng() & 1) << 15 | static_cast<unsigned>(e) << 7 | (rng() & 0x7F));
    }
  }
  std::vector<uint8_t> slot(shape.slot_bytes(capacity));
  const gaac::TileEncoding enc = gaac::encode_tile(shape, tile.data(), static_cast<size_t>(shape.channels), {b3, b4},
                                                   capacity, slot, gaac::Backend::scalar);
  if (!enc.fits) return {};
  std::vector<uint8_t> input = {
      static_cast<uint8_t>((shape.kind == gaac::TensorKind::value ? 1 : 0) | (shape.channels == 128 ? 2 : 0) |
                           (stride_extra & 63) << 2),
      static_cast<uint8_t>(capacity / gaac::kSlotAlignment), base3, base4, step3, step4};
  input.insert(input.end(), slot.begin(), slot.end());
  return input;
}

int write_tiles(const fs::path& dir) {
  std::mt19937_64 rng(20240601);
  int n = 0;
  for (const gaac::TensorKind kind : {gaac::TensorKind::key, gaac::TensorKind::value}) {
    for (const int channels : {64, 128}) {
      const gaac::TileShape shape{kind, channels};
      struct Seed {
        size_t capacity;
        uint8_t stride_extra, base3, base4, step3, step4;
        double p3;
      };
      const Seed seeds[] = {
          {0, 0, 120, 116, 0, 0, 1.0},                          // all 3-bit, no escape slot
          {shape.max_slot_capacity(), 0, 120, 116, 0, 0, 0.9},  // mixed modes, roomy slot
          {shape.max_slot_capacity(), 5, 100, 90, 3, 7, 0.8},   // per-channel bases, strided rows
          {shape.max_slot_capacity(), 0, 248, 240, 0, 0, 0.7},  // bases at their maximum
          {shape.max_slot_capacity(), 1, 0, 0, 1, 1, 0.6},      // bases from 0, many escapes
      };
      for (const Seed& s : seeds) {
        // Retry a few times when the random tile does not fit its slot.
        for (int attempt = 0; attempt < 20; ++attempt) {
          const auto input = tile_input(shape, s.capacity, s.stride_extra, s.base3, s.base4, s.step3, s.step4, s.p3, rng);
          if (input.empty()) continue;
          write_file(dir / ("tile_" + std::to_string(n++) + ".bin"), input);
          break;
        }
      }
    }
  }
  return n;
}

int write_safetensors(const fs::path& dir) {
  const auto dump = dump_of(2, 64, {17, 3}, 6);
  gaac::save_kv_dump(dump, (dir / "kv_dump.safetensors").string());
  gaac::save_calibration(calibrated(dump), (dir / "calibration.safetensors").string());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s <snapshot_dir> <tile_dir> [<safetensors_dir>]\n", argv[0]);
    return 2;
  }
  try {
    std::vector<fs::path> dirs(argv + 1, argv + argc);
    for (const auto& d : dirs) fs::create_directories(d);
    const int snapshots = write_snapshots(dirs[0]);
    const int tiles = write_tiles(dirs[1]);
    const int tensors = dirs.size() > 2 ? write_safetensors(dirs[2]) : 0;
    std::printf("wrote %d snapshots, %d tiles, %d safetensors files\n", snapshots, tiles, tensors);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gaac_fuzz_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
