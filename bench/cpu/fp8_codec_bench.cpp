// FP8 tile codec throughput (scalar and AVX2 backends) against zstd and LZ4 on the same FP8 KV. Every
// benchmark processes a whole corpus (K and V, every head, every 16-token tile) per iteration and counts
// its FP8 bytes as processed; `ratio` is FP8 bytes / stored bytes (slots, raw tiles, bases). Corpora, each
// in E4M3 and E5M2, converted with per-tensor scales (gaac::convert_to_fp8) and calibrated on themselves:
//   synthetic_hd128, synthetic_hd64   one synthetic layer of 8 KV heads (2 MiB of FP8)
//   smollm2, gemma3                   the real caches scripts/bench_kv.sh writes (2,048 tokens of GPL-3,
//                                     every layer: 22.5 / 18 MiB of FP8) when present in $GAAC_KV_DIR
//                                     (default ~/.cache/gaac/kv)
//
//   gaac_fp8_codec_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <lz4.h>
#include <zstd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/fp8_codec.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"
#include "io/kv_dump_file.hpp"

namespace {

using gaac::Backend;
using gaac::TensorKind;

/// One tensor's tiles: where each starts and which codec (per backend) codes it.
struct Part {
  const gaac::Fp8KvTensor* tensor;
  TensorKind kind;
  int layer;
  gaac::Fp8TileShape shape;
  size_t capacity;
  std::vector<size_t> offsets;            // of each tile's first element
  std::vector<std::pair<int, int>> head;  // (head, half) of each tile
};

/// An FP8 dump, its calibration and the tile codecs of every available backend.
struct Corpus {
  gaac::Fp8KvDump dump;
  gaac::CalibrationTable table;
  std::map<Backend, gaac::Fp8CalibratedCodecs> codecs;
  std::vector<Part> parts;
  size_t fp8_bytes = 0;

  void index() {
    const gaac::Fp8KvDump* dumps[] = {&dump};
    table = gaac::calibrate(dumps);
    for (const Backend b : {Backend::scalar, Backend::avx2}) {
      if (gaac::backend_available(b)) codecs.emplace(b, gaac::Fp8CalibratedCodecs(table, std::nullopt, b));
    }
    for (size_t l = 0; l < dump.layers.size(); ++l) {
      for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
        const gaac::Fp8KvTensor& t = dump.layers[l].of(kind);
        Part p{&t, kind, static_cast<int>(l), {dump.format, gaac::tile_shape_for(kind, t.head_dim)},
               table.escape_capacity(kind, static_cast<int>(l)), {}, {}};
        const gaac::Fp8KvView view = gaac::view_of(t);
        for (size_t i = 0; i < gaac::tile_count(view); ++i) {
          const gaac::TilePosition at = gaac::tile_position(view, i);
          p.offsets.push_back(static_cast<size_t>(gaac::tile_origin(view, at) - view.data));
          p.head.emplace_back(at.head, at.half);
        }
        fp8_bytes += t.data.size();
        parts.push_back(std::move(p));
      }
    }
  }
  const gaac::Fp8TileCodec& codec(const Part& p, size_t i, Backend b) const {
    return codecs.at(b).codec(p.kind, p.layer, p.head[i].first, p.head[i].second);
  }
};

std::unique_ptr<Corpus> from_bf16(const gaac::KvDump& bf16, gaac::ElementFormat format) {
  auto c = std::make_unique<Corpus>();
  c->dump = gaac::convert_to_fp8(bf16, format, gaac::Fp8Scaling::per_tensor);
  c->index();
  return c;
}

/// The tiles of a corpus stored by the codec: one slot per tile, raw rows for tiles that do not fit.
struct Encoded {
  std::vector<std::vector<uint8_t>> slots, raw;
  std::vector<std::vector<uint8_t>> is_raw;
  size_t stored_bytes = 0;
};

void copy_rows(const uint8_t* src, size_t src_stride, uint8_t* dst, size_t dst_stride, int width) {
  for (int t = 0; t < gaac::kTileTokens; ++t) std::memcpy(dst + t * dst_stride, src + t * src_stride, static_cast<size_t>(width));
}

void encode(const Corpus& c, Backend backend, Encoded& out) {
  out.slots.resize(c.parts.size());
  out.raw.resize(c.parts.size());
  out.is_raw.resize(c.parts.size());
  out.stored_bytes = c.table.bases_bytes();
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const Part& part = c.parts[p];
    const size_t slot = part.shape.slot_bytes(part.capacity), raw = part.shape.raw_bytes(), tiles = part.offsets.size();
    const size_t stride = gaac::view_of(*part.tensor).token_stride;
    out.slots[p].resize(slot * tiles);
    out.raw[p].resize(raw * tiles);
    out.is_raw[p].resize(tiles);
    for (size_t i = 0; i < tiles; ++i) {
      const uint8_t* src = part.tensor->data.data() + part.offsets[i];
      gaac::TileEncoding e;
      c.codec(part, i, backend).encode_blocks(src, stride, 0, 1, out.slots[p].data() + i * slot, 0, &e);
      out.is_raw[p][i] = !e.fits;
      if (!e.fits) copy_rows(src, stride, out.raw[p].data() + i * raw, static_cast<size_t>(part.shape.tile.channels), part.shape.tile.channels);
      out.stored_bytes += e.fits ? slot : raw;
    }
  }
}

bool decode(const Corpus& c, const Encoded& in, Backend backend, std::vector<std::vector<uint8_t>>& dst) {
  dst.resize(c.parts.size());
  bool ok = true;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const Part& part = c.parts[p];
    const size_t slot = part.shape.slot_bytes(part.capacity), raw = part.shape.raw_bytes();
    const size_t stride = gaac::view_of(*part.tensor).token_stride;
    dst[p].resize(part.tensor->data.size());
    for (size_t i = 0; i < part.offsets.size(); ++i) {
      uint8_t* out = dst[p].data() + part.offsets[i];
      if (in.is_raw[p][i]) {
        copy_rows(in.raw[p].data() + i * raw, static_cast<size_t>(part.shape.tile.channels), out, stride, part.shape.tile.channels);
        continue;
      }
      ok &= c.codec(part, i, backend).decode_blocks(in.slots[p].data() + i * slot, 0, 1, out, stride, 0).status == gaac::DecodeStatus::ok;
    }
  }
  return ok;
}

void set_counters(benchmark::State& state, const Corpus& c, size_t stored) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(c.fp8_bytes));
  state.counters["ratio"] = static_cast<double>(c.fp8_bytes) / static_cast<double>(stored);
}

void BM_Encode(benchmark::State& state, const Corpus& c, Backend backend) {
  if (!gaac::backend_available(backend)) return state.SkipWithError("backend not available on this machine");
  Encoded e;
  for (auto _ : state) {
    encode(c, backend, e);
    benchmark::ClobberMemory();
  }
  set_counters(state, c, e.stored_bytes);
}

void BM_Decode(benchmark::State& state, const Corpus& c, Backend backend) {
  if (!gaac::backend_available(backend)) return state.SkipWithError("backend not available on this machine");
  Encoded e;
  encode(c, Backend::scalar, e);
  std::vector<std::vector<uint8_t>> out;
  bool ok = true;
  for (auto _ : state) {
    ok &= decode(c, e, backend, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  for (size_t p = 0; p < c.parts.size(); ++p) ok &= out[p] == c.parts[p].tensor->data;
  if (!ok) state.SkipWithError("decoded FP8 differs from the source");
  set_counters(state, c, e.stored_bytes);
}

/// zstd level 1 and LZ4 on each tensor's FP8 bytes as one buffer, decompression timed.
void BM_GeneralDecode(benchmark::State& state, const Corpus& c, bool lz4) {
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  std::vector<std::vector<char>> packed(c.parts.size());
  std::vector<size_t> sizes(c.parts.size());
  std::vector<std::vector<uint8_t>> out(c.parts.size());
  size_t stored = 0;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const auto& data = c.parts[p].tensor->data;
    if (lz4) {
      packed[p].resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(data.size()))));
      sizes[p] = static_cast<size_t>(LZ4_compress_default(reinterpret_cast<const char*>(data.data()), packed[p].data(),
                                                          static_cast<int>(data.size()), static_cast<int>(packed[p].size())));
    } else {
      packed[p].resize(ZSTD_compressBound(data.size()));
      sizes[p] = ZSTD_compress(packed[p].data(), packed[p].size(), data.data(), data.size(), 1);
    }
    stored += sizes[p];
    out[p].resize(data.size());
  }
  for (auto _ : state) {
    for (size_t p = 0; p < c.parts.size(); ++p) {
      if (lz4) {
        LZ4_decompress_safe(packed[p].data(), reinterpret_cast<char*>(out[p].data()), static_cast<int>(sizes[p]), static_cast<int>(out[p].size()));
      } else {
        ZSTD_decompressDCtx(dctx.get(), out[p].data(), out[p].size(), packed[p].data(), sizes[p]);
      }
    }
    benchmark::ClobberMemory();
  }
  for (size_t p = 0; p < c.parts.size(); ++p) {
    if (out[p] != c.parts[p].tensor->data) state.SkipWithError("decompressed FP8 differs from the source");
  }
  set_counters(state, c, stored);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::vector<std::pair<std::string, std::unique_ptr<Corpus>>> corpora;
  for (const auto format : {gaac::ElementFormat::e4m3, gaac::ElementFormat::e5m2}) {
    const std::string f = gaac::to_string(format);
    for (const int head_dim : {128, 64}) {
      gaac::SyntheticKvSpec spec;
      spec.layers = 1;
      spec.kv_heads = 8;
      spec.head_dim = head_dim;
      spec.tokens = (2 << 20) / 2 / (8 * head_dim);  // 2 MiB of FP8: K and V of 1 MiB
      spec.seed = 7;
      corpora.emplace_back(f + "/synthetic_hd" + std::to_string(head_dim), from_bf16(gaac::make_synthetic_kv(spec), format));
    }
    const char* env = std::getenv("GAAC_KV_DIR");
    const char* home = std::getenv("HOME");
    const std::filesystem::path dir = env ? env : std::string(home ? home : ".") + "/.cache/gaac/kv";
    for (const std::string model : {"smollm2", "gemma3"}) {
      const auto path = dir / (model + "-gpl3-2048.safetensors");
      if (std::filesystem::exists(path)) corpora.emplace_back(f + "/" + model, from_bf16(gaac::io::load_kv_dump(path.string()), format));
    }
  }
  const auto add = [](const std::string& name, auto fn) { benchmark::RegisterBenchmark(name.c_str(), fn)->Unit(benchmark::kMicrosecond); };
  for (const auto& [name, corpus] : corpora) {
    const Corpus& c = *corpus;
    for (const auto& [backend_name, backend] : {std::pair{"scalar", Backend::scalar}, std::pair{"avx2", Backend::avx2}}) {
      add("encode/gaac_" + std::string(backend_name) + "/" + name, [&c, backend](benchmark::State& s) { BM_Encode(s, c, backend); });
      add("decode/gaac_" + std::string(backend_name) + "/" + name, [&c, backend](benchmark::State& s) { BM_Decode(s, c, backend); });
    }
    add("decode/zstd1/" + name, [&c](benchmark::State& s) { BM_GeneralDecode(s, c, false); });
    add("decode/lz4/" + name, [&c](benchmark::State& s) { BM_GeneralDecode(s, c, true); });
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
