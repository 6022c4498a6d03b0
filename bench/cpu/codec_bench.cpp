// Tile codec throughput (the scalar and AVX2 backends) against zstd and LZ4 on the same KV. Every
// benchmark processes one whole corpus (K and V, every head, every 16-token tile) per iteration and
// counts its BF16 bytes as processed; `ratio` is BF16 bytes / stored bytes. Corpora, ~4 MiB each:
//   synthetic_hd128, synthetic_hd64   one synthetic layer of 8 KV heads, calibrated on itself
//   smollm2, gemma3                   the real caches scripts/bench_kv.sh writes (2,048 tokens of GPL-3,
//                                     every layer: 45 / 36 MiB) with their calibration tables, learnt on
//                                     another text, when present in $GAAC_KV_DIR (default ~/.cache/gaac/kv)
//   smollm2_early, gemma3_early       the first layers of the same caches (~4 MiB)
//
//   gaac_codec_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tile_codec.hpp"
#include "gaac/tiling.hpp"
#include "io/kv_dump_file.hpp"

namespace {

using gaac::Backend;
using gaac::KvTensor;
using gaac::TensorKind;
using gaac::TileShape;

constexpr int kHeads = 8;
constexpr int kLayerBf16Bytes = 4 << 20;  // K and V of one layer: 2 MiB each

/// One tensor (K or V of one layer), with the tile codecs of its kind and layer (one set per backend).
struct TiledTensor {
  const KvTensor* tensor;
  TensorKind kind;
  int layer;
  TileShape shape;
  const gaac::CalibrationTable* table;
  const std::map<Backend, gaac::CalibratedCodecs>* codecs;

  size_t capacity() const { return table->escape_capacity(kind, layer); }
  size_t stride() const { return gaac::view_of(*tensor).token_stride; }
  int tiles() const { return static_cast<int>(gaac::tile_count(gaac::view_of(*tensor))); }
  size_t offset(int i) const {
    const gaac::KvView view = gaac::view_of(*tensor);
    return static_cast<size_t>(gaac::tile_origin(view, gaac::tile_position(view, static_cast<size_t>(i))) - view.data);
  }
  const gaac::TileCodec& codec(int i, Backend backend) const {
    const gaac::TilePosition p = gaac::tile_position(gaac::view_of(*tensor), static_cast<size_t>(i));
    return codecs->at(backend).codec(kind, layer, p.head, p.half);
  }
};

/// The KV a benchmark runs on: some layers of a dump and the calibration table it is coded with.
struct Corpus {
  gaac::KvDump dump;
  gaac::CalibrationTable table;
  std::vector<TiledTensor> parts;
  size_t bf16_bytes = 0;
  size_t bases_bytes = 0;  ///< the bases of the layers used (counted as stored bytes)
  std::map<Backend, gaac::CalibratedCodecs> codecs;  ///< per available backend

  /// Lists the K and V of every layer of `dump` as parts, and prepares the tile codecs of every backend.
  void index() {
    for (const Backend b : {Backend::scalar, Backend::avx2}) {
      if (gaac::backend_available(b)) codecs.emplace(b, gaac::CalibratedCodecs(table, std::nullopt, b));
    }
    bases_bytes = table.bases_bytes() / static_cast<size_t>(table.layers()) * dump.layers.size();
    for (size_t l = 0; l < dump.layers.size(); ++l) {
      for (const auto& [tensor, kind] : {std::pair{&dump.layers[l].k, TensorKind::key}, std::pair{&dump.layers[l].v, TensorKind::value}}) {
        parts.push_back({tensor, kind, static_cast<int>(l), gaac::tile_shape_for(kind, tensor->head_dim), &table, &codecs});
        bf16_bytes += tensor->data.size() * sizeof(uint16_t);
      }
    }
  }
};

/// One synthetic layer of 8 heads (4 MiB of BF16), calibrated on itself.
std::unique_ptr<Corpus> synthetic_corpus(int head_dim) {
  auto c = std::make_unique<Corpus>();
  gaac::SyntheticKvSpec spec;
  spec.layers = 1;
  spec.kv_heads = kHeads;
  spec.head_dim = head_dim;
  spec.tokens = kLayerBf16Bytes / 2 / 2 / (kHeads * head_dim);
  spec.seed = 7;
  c->dump = gaac::make_synthetic_kv(spec);
  const gaac::KvDump* dumps[] = {&c->dump};
  c->table = gaac::calibrate(dumps);
  c->index();
  return c;
}

/// A real cache written by scripts/bench_kv.sh, its first layers up to `max_bytes` of BF16, with the
/// calibration table learnt on another text; null when the files are absent.
std::unique_ptr<Corpus> real_corpus(const std::string& model, size_t max_bytes) {
  const char* env = std::getenv("GAAC_KV_DIR");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir = env ? env : std::string(home ? home : ".") + "/.cache/gaac/kv";
  const auto kv = dir / (model + "-gpl3-2048.safetensors"), calib = dir / (model + "-calibration.safetensors");
  if (!std::filesystem::exists(kv) || !std::filesystem::exists(calib)) return nullptr;
  auto c = std::make_unique<Corpus>();
  c->dump = gaac::io::load_kv_dump(kv.string());
  c->table = gaac::load_calibration(calib.string());
  size_t bytes = 0, layers = 0;
  while (layers < c->dump.layers.size() && bytes < max_bytes) {
    bytes += 2 * c->dump.layers[layers++].k.data.size() * sizeof(uint16_t);
  }
  c->dump.layers.resize(layers);  // the table keeps every layer; parts use the first ones by index
  c->index();
  return c;
}

/// A layer stored by the tile codec: one fixed-size slot per tile, raw rows for tiles that do not fit.
struct Encoded {
  struct Part {
    std::vector<uint8_t> slots;
    std::vector<uint16_t> raw;  // tile-major, 16 rows of head_dim each, for tiles that do not fit
    std::vector<uint8_t> is_raw;
  };
  std::vector<Part> parts;
  size_t stored_bytes = 0;
};

void copy_rows(const uint16_t* src, size_t src_stride, uint16_t* dst, size_t dst_stride, int width) {
  for (int t = 0; t < gaac::kTileTokens; ++t) {
    std::memcpy(dst + t * dst_stride, src + t * src_stride, static_cast<size_t>(width) * sizeof(uint16_t));
  }
}

void encode_layer(const Corpus& c, Backend backend, Encoded& out) {
  out.parts.resize(c.parts.size());
  out.stored_bytes = 0;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const TiledTensor& part = c.parts[p];
    Encoded::Part& enc = out.parts[p];
    const size_t slot_bytes = part.shape.slot_bytes(part.capacity());
    const auto width = static_cast<size_t>(part.shape.channels);
    enc.slots.resize(slot_bytes * static_cast<size_t>(part.tiles()));
    enc.raw.resize(static_cast<size_t>(part.shape.elements()) * static_cast<size_t>(part.tiles()));
    enc.is_raw.resize(static_cast<size_t>(part.tiles()));
    for (int i = 0; i < part.tiles(); ++i) {
      const uint16_t* src = part.tensor->data.data() + part.offset(i);
      const auto tile = static_cast<size_t>(i);
      gaac::TileEncoding e;
      part.codec(i, backend).encode_blocks(src, part.stride(), 0, 1, enc.slots.data() + tile * slot_bytes, 0, &e);
      enc.is_raw[tile] = !e.fits;
      if (!e.fits) copy_rows(src, part.stride(), enc.raw.data() + tile * part.shape.elements(), width, part.shape.channels);
      out.stored_bytes += e.fits ? slot_bytes : part.shape.raw_bytes();
    }
  }
  out.stored_bytes += c.bases_bytes;
}

/// Decodes a layer into `dst` (one buffer per part, shaped like the source); false on a bad slot.
bool decode_layer(const Corpus& c, const Encoded& in, Backend backend, std::vector<std::vector<uint16_t>>& dst) {
  dst.resize(c.parts.size());
  bool ok = true;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const TiledTensor& part = c.parts[p];
    const Encoded::Part& enc = in.parts[p];
    const size_t slot_bytes = part.shape.slot_bytes(part.capacity());
    dst[p].resize(part.tensor->data.size());
    for (int i = 0; i < part.tiles(); ++i) {
      const auto tile = static_cast<size_t>(i);
      uint16_t* out = dst[p].data() + part.offset(i);
      if (enc.is_raw[tile]) {
        copy_rows(enc.raw.data() + tile * part.shape.elements(), static_cast<size_t>(part.shape.channels), out,
                  part.stride(), part.shape.channels);
        continue;
      }
      ok &= part.codec(i, backend).decode_blocks(enc.slots.data() + tile * slot_bytes, 0, 1, out, part.stride(), 0).status ==
            gaac::DecodeStatus::ok;
    }
  }
  return ok;
}

bool skip_unavailable(benchmark::State& state, Backend backend) {
  if (gaac::backend_available(backend)) return false;
  state.SkipWithError("backend not available on this machine");
  return true;
}

void set_counters(benchmark::State& state, const Corpus& c, size_t stored_bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(c.bf16_bytes));
  state.counters["ratio"] = static_cast<double>(c.bf16_bytes) / static_cast<double>(stored_bytes);
}

void BM_GaacEncode(benchmark::State& state, const Corpus& c, Backend backend) {
  if (skip_unavailable(state, backend)) return;
  Encoded encoded;
  for (auto _ : state) {
    encode_layer(c, backend, encoded);
    benchmark::DoNotOptimize(encoded.parts.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, c, encoded.stored_bytes);
  size_t fitting = 0, tiles = 0;
  for (const auto& part : encoded.parts) {
    tiles += part.is_raw.size();
    fitting += static_cast<size_t>(std::count(part.is_raw.begin(), part.is_raw.end(), 0));
  }
  state.counters["fit"] = static_cast<double>(fitting) / static_cast<double>(tiles);
}

void BM_GaacDecode(benchmark::State& state, const Corpus& c, Backend backend) {
  if (skip_unavailable(state, backend)) return;
  Encoded encoded;
  encode_layer(c, Backend::scalar, encoded);
  std::vector<std::vector<uint16_t>> decoded;
  bool ok = true;
  for (auto _ : state) {
    ok &= decode_layer(c, encoded, backend, decoded);
    benchmark::DoNotOptimize(decoded.data());
    benchmark::ClobberMemory();
  }
  for (size_t p = 0; p < c.parts.size(); ++p) ok &= decoded[p] == c.parts[p].tensor->data;
  if (!ok) state.SkipWithError("decoded layer differs from the source");
  set_counters(state, c, encoded.stored_bytes);
}

/// zstd and LZ4 compress each tensor (K, V) of the layer as one buffer.
enum class General { zstd1, zstd3, lz4 };

size_t general_compress(General codec, const uint16_t* src, size_t bytes, std::vector<char>& dst, ZSTD_CCtx* cctx) {
  if (codec == General::lz4) {
    dst.resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(bytes))));
    return static_cast<size_t>(LZ4_compress_default(reinterpret_cast<const char*>(src), dst.data(), static_cast<int>(bytes),
                                                    static_cast<int>(dst.size())));
  }
  dst.resize(ZSTD_compressBound(bytes));
  return ZSTD_compressCCtx(cctx, dst.data(), dst.size(), src, bytes, codec == General::zstd1 ? 1 : 3);
}

void general_decompress(General codec, const std::vector<char>& src, size_t compressed, uint16_t* dst, size_t bytes,
                        ZSTD_DCtx* dctx) {
  if (codec == General::lz4) {
    LZ4_decompress_safe(src.data(), reinterpret_cast<char*>(dst), static_cast<int>(compressed), static_cast<int>(bytes));
  } else {
    ZSTD_decompressDCtx(dctx, dst, bytes, src.data(), compressed);
  }
}

void BM_GeneralCompress(benchmark::State& state, const Corpus& c, General codec) {
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  std::vector<std::vector<char>> out(c.parts.size());
  size_t stored = 0;
  for (auto _ : state) {
    stored = 0;
    for (size_t p = 0; p < c.parts.size(); ++p) {
      const auto& data = c.parts[p].tensor->data;
      stored += general_compress(codec, data.data(), data.size() * sizeof(uint16_t), out[p], cctx.get());
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, c, stored);
}

void BM_GeneralDecompress(benchmark::State& state, const Corpus& c, General codec) {
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
  std::vector<std::vector<char>> compressed(c.parts.size());
  std::vector<size_t> sizes(c.parts.size());
  std::vector<std::vector<uint16_t>> decoded(c.parts.size());
  size_t stored = 0;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const auto& data = c.parts[p].tensor->data;
    sizes[p] = general_compress(codec, data.data(), data.size() * sizeof(uint16_t), compressed[p], cctx.get());
    stored += sizes[p];
    decoded[p].resize(data.size());
  }
  for (auto _ : state) {
    for (size_t p = 0; p < c.parts.size(); ++p) {
      general_decompress(codec, compressed[p], sizes[p], decoded[p].data(), decoded[p].size() * sizeof(uint16_t), dctx.get());
    }
    benchmark::DoNotOptimize(decoded.data());
    benchmark::ClobberMemory();
  }
  for (size_t p = 0; p < c.parts.size(); ++p) {
    if (decoded[p] != c.parts[p].tensor->data) state.SkipWithError("decompressed layer differs from the source");
  }
  set_counters(state, c, stored);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Corpora live until the end of main; benchmarks are registered per corpus, named after it.
  std::vector<std::pair<std::string, std::unique_ptr<Corpus>>> corpora;
  corpora.emplace_back("synthetic_hd128", synthetic_corpus(128));
  corpora.emplace_back("synthetic_hd64", synthetic_corpus(64));
  for (const std::string model : {"smollm2", "gemma3"}) {
    if (auto c = real_corpus(model, SIZE_MAX)) corpora.emplace_back(model, std::move(c));
    if (auto c = real_corpus(model, kLayerBf16Bytes)) corpora.emplace_back(model + "_early", std::move(c));
  }
  const std::pair<const char*, Backend> backends[] = {{"scalar", Backend::scalar}, {"avx2", Backend::avx2}};
  const std::pair<const char*, General> generals[] = {{"zstd1", General::zstd1}, {"zstd3", General::zstd3}, {"lz4", General::lz4}};
  const auto add = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)->Unit(benchmark::kMicrosecond);
  };
  for (const auto& [name, corpus] : corpora) {
    const Corpus& c = *corpus;
    for (const auto& [backend_name, backend] : backends) {
      add("encode/gaac_" + std::string(backend_name) + "/" + name, [&c, backend](benchmark::State& s) { BM_GaacEncode(s, c, backend); });
      add("decode/gaac_" + std::string(backend_name) + "/" + name, [&c, backend](benchmark::State& s) { BM_GaacDecode(s, c, backend); });
    }
    for (const auto& [codec_name, codec] : generals) {
      add("encode/" + std::string(codec_name) + "/" + name, [&c, codec](benchmark::State& s) { BM_GeneralCompress(s, c, codec); });
      add("decode/" + std::string(codec_name) + "/" + name, [&c, codec](benchmark::State& s) { BM_GeneralDecompress(s, c, codec); });
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
