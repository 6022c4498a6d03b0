// Seed corpus for the fuzz targets, so that fuzzing starts from valid inputs:
//
//   gaac_fuzz_corpus <snapshot_dir> <tile_dir> [<safetensors_dir> [<gguf_dir> [<chunk_dir>]]]
//
// writes small valid .gaac images, BF16 and FP8 (gaac_snapshot_fuzz), valid BF16 and FP8 tile slots behind the 6-byte header
// that fuzz/tile_decode_fuzz.cpp describes (gaac_tile_decode_fuzz) and, when a third directory is
// given, a KV dump and a calibration table as safetensors (gaac_safetensors_fuzz), and when a fourth
// is, small GGUF files (gaac_gguf_fuzz), and with a fifth KV chunk objects behind the 3-byte header
// of fuzz/chunk_fuzz_setup.hpp (gaac_chunk_fuzz). Deterministic: the same files every run.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chunk_fuzz_setup.hpp"
#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/fp8_codec.hpp"
#include "gaac/snapshot.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"
#include "io/kv_dump_file.hpp"

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
  {  // FP8: E4M3 with scales and a tail, E5M2 without scales in half-head tiles.
    const auto bf16 = dump_of(1, 64, {37, 20}, 8);
    const gaac::Fp8KvDump e4m3 = gaac::convert_to_fp8(bf16, gaac::ElementFormat::e4m3, gaac::Fp8Scaling::per_tensor);
    const gaac::Fp8KvDump* dumps[] = {&e4m3};
    write_file(dir / "fp8_e4m3_64.gaac", gaac::snapshot_image(e4m3, gaac::calibrate(std::span<const gaac::Fp8KvDump* const>(dumps))));
    gaac::Fp8KvDump e5m2 = gaac::convert_to_fp8(dump_of(1, 256, {16}, 9), gaac::ElementFormat::e5m2, gaac::Fp8Scaling::none);
    e5m2.k_scales.clear();
    e5m2.v_scales.clear();
    dumps[0] = &e5m2;
    write_file(dir / "fp8_e5m2_256.gaac", gaac::snapshot_image(e5m2, gaac::calibrate(std::span<const gaac::Fp8KvDump* const>(dumps))));
    n += 2;
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
                           (stride_extra & 15) << 4),
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

/// One FP8 tile-fuzz input: header (format in bits 2..3), then the slot of a random FP8 tile with the
/// header's bases (2-bit window with probability p2, else 3-bit, else anywhere).
std::vector<uint8_t> fp8_tile_input(gaac::Fp8TileShape shape, size_t capacity, uint8_t base2, uint8_t base3, uint8_t step2,
                                    uint8_t step3, double p2, std::mt19937_64& rng) {
  const auto channels = static_cast<size_t>(shape.tile.channels);
  std::vector<uint8_t> b2(channels), b3(channels);
  for (size_t c = 0; c < channels; ++c) {
    b2[c] = static_cast<uint8_t>((base2 + c * step2) % static_cast<size_t>(gaac::fp8_max_base2(shape.format) + 1));
    b3[c] = static_cast<uint8_t>((base3 + c * step3) % static_cast<size_t>(gaac::fp8_max_base3(shape.format) + 1));
  }
  const int m = gaac::mantissa_bits(shape.format), top = (1 << gaac::exponent_bits(shape.format)) - 1;
  std::vector<uint8_t> tile(static_cast<size_t>(shape.elements()));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (size_t i = 0; i < tile.size(); ++i) {
    const size_t c = i % channels;
    const double r = u(rng);
    const int e = r < p2 ? b2[c] + static_cast<int>(rng() % 4) : r < p2 + (1 - p2) * 0.9 ? b3[c] + static_cast<int>(rng() % 8)
                                                                                          : static_cast<int>(rng() % (top + 1));
    tile[i] = static_cast<uint8_t>((rng() & 1) << 7 | e << m | (rng() & ((1u << m) - 1)));
  }
  std::vector<uint8_t> slot(shape.slot_bytes(capacity));
  const gaac::TileEncoding enc = gaac::encode_fp8_tile(shape, tile.data(), channels, {b2, b3}, capacity, slot, gaac::Backend::scalar);
  if (!enc.fits) return {};
  std::vector<uint8_t> input = {
      static_cast<uint8_t>((shape.tile.kind == gaac::TensorKind::value ? 1 : 0) | (channels == 128 ? 2 : 0) |
                           (shape.format == gaac::ElementFormat::e4m3 ? 1 : 2) << 2),
      static_cast<uint8_t>(capacity / gaac::kSlotAlignment), base2, base3, step2, step3};
  input.insert(input.end(), slot.begin(), slot.end());
  return input;
}

int write_fp8_tiles(const fs::path& dir) {
  std::mt19937_64 rng(20261203);
  int n = 0;
  for (const gaac::ElementFormat format : {gaac::ElementFormat::e4m3, gaac::ElementFormat::e5m2}) {
    for (const gaac::TensorKind kind : {gaac::TensorKind::key, gaac::TensorKind::value}) {
      for (const int channels : {64, 128}) {
        const gaac::Fp8TileShape shape{format, {kind, channels}};
        const double mixes[] = {1.0, 0.3, 0.1};
        for (const double p2 : mixes) {
          for (int attempt = 0; attempt < 20; ++attempt) {
            const auto input = fp8_tile_input(shape, shape.max_slot_capacity(), 3, 1, 1, 2, p2, rng);
            if (input.empty()) continue;
            write_file(dir / ("fp8_tile_" + std::to_string(n++) + ".bin"), input);
            break;
          }
        }
      }
    }
  }
  return n;
}

int write_safetensors(const fs::path& dir) {
  const auto dump = dump_of(2, 64, {17, 3}, 6);
  gaac::io::save_kv_dump(dump, (dir / "kv_dump.safetensors").string());
  gaac::save_calibration(calibrated(dump), (dir / "calibration.safetensors").string());
  const gaac::Fp8KvDump fp8 = gaac::convert_to_fp8(dump, gaac::ElementFormat::e5m2, gaac::Fp8Scaling::per_tensor);
  gaac::io::save_fp8_kv_dump(fp8, (dir / "fp8_kv_dump.safetensors").string());
  const gaac::Fp8KvDump* dumps[] = {&fp8};
  gaac::save_calibration(gaac::calibrate(std::span<const gaac::Fp8KvDump* const>(dumps)),
                         (dir / "fp8_calibration.safetensors").string());
  return 4;
}

// GGUF: a minimal little-endian writer (layout in src/model/gguf.hpp and tests/model/gguf_test.cpp).

void put_le(std::vector<uint8_t>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put_le(out, s.size(), 8);
  out.insert(out.end(), s.begin(), s.end());
}

/// An encoded metadata value: type id, then its bytes.
struct GgufValue {
  uint32_t type;
  std::vector<uint8_t> bytes;
};
GgufValue gguf_scalar(uint32_t type, uint64_t bits, int n) {
  GgufValue v{type, {}};
  put_le(v.bytes, bits, n);
  return v;
}
GgufValue gguf_str(const std::string& s) {
  GgufValue v{8, {}};
  put_str(v.bytes, s);
  return v;
}
GgufValue gguf_array(uint32_t item_type, const std::vector<GgufValue>& items) {
  GgufValue v{9, {}};
  put_le(v.bytes, item_type, 4);
  put_le(v.bytes, items.size(), 8);
  for (const GgufValue& item : items) v.bytes.insert(v.bytes.end(), item.bytes.begin(), item.bytes.end());
  return v;
}

struct GgufTensorSeed {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  size_t bytes;  // filled with a byte ramp
};

std::vector<uint8_t> gguf_image(uint32_t version, uint64_t alignment,
                                const std::vector<std::pair<std::string, GgufValue>>& kvs,
                                const std::vector<GgufTensorSeed>& tensors) {
  const auto align = [alignment](uint64_t n) { return (n + alignment - 1) / alignment * alignment; };
  std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
  put_le(out, version, 4);
  put_le(out, tensors.size(), 8);
  put_le(out, kvs.size(), 8);
  for (const auto& [key, value] : kvs) {
    put_str(out, key);
    put_le(out, value.type, 4);
    out.insert(out.end(), value.bytes.begin(), value.bytes.end());
  }
  uint64_t offset = 0;
  for (const GgufTensorSeed& t : tensors) {
    put_str(out, t.name);
    put_le(out, t.ne.size(), 4);
    for (const uint64_t n : t.ne) put_le(out, n, 8);
    put_le(out, t.type, 4);
    put_le(out, offset, 8);
    offset = align(offset + t.bytes);
  }
  for (const GgufTensorSeed& t : tensors) {
    out.resize(align(out.size()), 0);
    for (size_t i = 0; i < t.bytes; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  }
  return out;
}

int write_gguf(const fs::path& dir) {
  const auto u32 = [](uint32_t v) { return gguf_scalar(4, v, 4); };
  const auto f32 = [](float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return gguf_scalar(6, bits, 4);
  };
  // A tiny llama-like model.
  write_file(dir / "llama_like.gguf",
             gguf_image(3, 32,
                        {{"general.architecture", gguf_str("llama")},
                         {"llama.block_count", u32(1)},
                         {"llama.rope.freq_base", f32(10000.0f)},
                         {"tokenizer.ggml.model", gguf_str("gpt2")},
                         {"tokenizer.ggml.tokens", gguf_array(8, {gguf_str("<s>"), gguf_str("a"), gguf_str("b")})},
                         {"tokenizer.ggml.token_type", gguf_array(5, {gguf_scalar(5, 3, 4), gguf_scalar(5, 1, 4)})},
                         {"tokenizer.ggml.bos_token_id", u32(0)}},
                        {{"token_embd.weight", {32, 3}, 8, 3 * 34},
                         {"output_norm.weight", {32}, 0, 128},
                         {"blk.0.ffn_down.weight", {256, 2}, 12, 2 * 144}}));
  // Every value type, nested arrays, version 2, no tensors.
  write_file(dir / "all_values_v2.gguf",
             gguf_image(2, 32,
                        {{"u8", gguf_scalar(0, 200, 1)},
                         {"i8", gguf_scalar(1, 0x9C, 1)},
                         {"u16", gguf_scalar(2, 60000, 2)},
                         {"i16", gguf_scalar(3, 0x8AD0, 2)},
                         {"u32", u32(4000000000u)},
                         {"i32", gguf_scalar(5, 0x88CA6C00, 4)},
                         {"f32", f32(1.5f)},
                         {"bool", gguf_scalar(7, 1, 1)},
                         {"string", gguf_str("text")},
                         {"u64", gguf_scalar(10, ~uint64_t{0}, 8)},
                         {"i64", gguf_scalar(11, uint64_t{1} << 63, 8)},
                         {"f64", gguf_scalar(12, 0x400921FB54442D18, 8)},
                         {"nested", gguf_array(9, {gguf_array(3, {gguf_scalar(3, 1, 2)}), gguf_array(8, {})})},
                         {"floats", gguf_array(6, {f32(0.5f), f32(-1.0f)})}},
                        {}));
  // Custom alignment and the remaining tensor types, including an empty and a 0-dimensional tensor.
  write_file(dir / "aligned_64.gguf",
             gguf_image(3, 64, {{"general.alignment", u32(64)}},
                        {{"f16", {4, 2}, 1, 16},
                         {"bf16", {2, 2, 2, 2}, 30, 32},
                         {"q4_0", {32}, 2, 18},
                         {"q4_1", {32}, 3, 20},
                         {"q5_0", {64}, 6, 44},
                         {"q5_1", {32}, 7, 24},
                         {"q5_k", {256}, 13, 176},
                         {"q6_k", {256}, 14, 210},
                         {"empty", {0, 4}, 0, 0},
                         {"scalar", {}, 0, 4}}));
  return 3;
}

/// KV chunk objects of each tile width, with and without a BF16 tail and raw tiles.
int write_chunks(const fs::path& dir) {
  int n = 0;
  for (const int head_dim : {64, 128, 256}) {
    for (const int tokens : {16, 37}) {
      const gaac::ChunkCodec& codec = gaac::fuzz::chunk_codec(head_dim);
      const gaac::ChunkGeometry g = codec.geometry(tokens);
      const gaac::KvDump dump = gaac::make_synthetic_kv(
          {.layers = g.layers, .kv_heads = g.kv_heads, .head_dim = head_dim, .tokens = tokens, .seed = static_cast<uint64_t>(n + 9)});
      std::vector<uint16_t> values(g.elements());
      const gaac::MutableChunkView view = gaac::dense_chunk_view(values.data(), g);
      std::mt19937_64 rng(static_cast<uint64_t>(n));
      for (int l = 0; l < g.layers; ++l) {
        for (const gaac::TensorKind kind : {gaac::TensorKind::key, gaac::TensorKind::value}) {
          const gaac::KvTensor& t = dump.layers[static_cast<size_t>(l)].of(kind);
          for (int tok = 0; tok < tokens; ++tok) {
            for (int h = 0; h < g.kv_heads; ++h) {
              for (int c = 0; c < head_dim; ++c) {
                // Layer 1's K of head 0 incompressible: raw tiles.
                const bool wild = l == 1 && kind == gaac::TensorKind::key && h == 0;
                view.tensor(kind, l).at(tok, h)[c] = wild ? static_cast<uint16_t>(rng()) : t.at(tok, h, c);
              }
            }
          }
        }
      }
      std::vector<uint8_t> object(codec.object_bytes(tokens));
      object.resize(codec.encode(gaac::dense_chunk_view(static_cast<const uint16_t*>(values.data()), g), gaac::fuzz::kChunkKey, object));
      std::vector<uint8_t> input = {static_cast<uint8_t>(head_dim == 64 ? 0 : head_dim == 128 ? 1 : 2),
                                    static_cast<uint8_t>(tokens), 0};
      input.insert(input.end(), object.begin(), object.end());
      write_file(dir / ("chunk_" + std::to_string(head_dim) + "_" + std::to_string(tokens) + ".bin"), input);
      ++n;
    }
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 6) {
    std::fprintf(stderr, "usage: %s <snapshot_dir> <tile_dir> [<safetensors_dir> [<gguf_dir> [<chunk_dir>]]]\n", argv[0]);
    return 2;
  }
  try {
    std::vector<fs::path> dirs(argv + 1, argv + argc);
    for (const auto& d : dirs) fs::create_directories(d);
    const int snapshots = write_snapshots(dirs[0]);
    const int tiles = write_tiles(dirs[1]) + write_fp8_tiles(dirs[1]);
    const int tensors = dirs.size() > 2 ? write_safetensors(dirs[2]) : 0;
    const int ggufs = dirs.size() > 3 ? write_gguf(dirs[3]) : 0;
    const int chunks = dirs.size() > 4 ? write_chunks(dirs[4]) : 0;
    std::printf("wrote %d snapshots, %d tiles, %d safetensors files, %d GGUF files, %d chunk objects\n", snapshots, tiles,
                tensors, ggufs, chunks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gaac_fuzz_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
