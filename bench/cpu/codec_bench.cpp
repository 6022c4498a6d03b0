// Tile codec throughput (scalar reference and AVX2) against zstd and LZ4 on the same synthetic KV
// layer. Every benchmark processes one whole layer (K and V, every head, every 16-token tile) per
// iteration and counts the layer's BF16 bytes as processed; `ratio` is BF16 bytes / stored bytes.
//
//   gaac_codec_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/codec.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tiling.hpp"

namespace {

using gaac::Backend;
using gaac::KvTensor;
using gaac::TensorKind;
using gaac::TileShape;

constexpr int kHeads = 8;
constexpr int kLayerBf16Bytes = 4 << 20;  // K and V of one layer: 2 MiB each

/// One tensor (K or V) of the layer, with the calibration of its kind.
struct TiledTensor {
  const KvTensor* tensor;
  TensorKind kind;
  TileShape shape;
  const gaac::CalibrationTable* table;

  size_t capacity() const { return table->escape_capacity(kind, 0); }
  size_t stride() const { return gaac::token_stride(*tensor); }
  int tiles() const { return static_cast<int>(gaac::tile_count(*tensor)); }
  size_t offset(int i) const { return gaac::tile_origin(*tensor, gaac::tile_position(*tensor, static_cast<size_t>(i))); }
  gaac::TileBases tile_bases(int i) const {
    const gaac::TilePosition p = gaac::tile_position(*tensor, static_cast<size_t>(i));
    return table->tile_bases(kind, 0, p.head, p.half);
  }
};

/// One synthetic layer, calibrated on itself (windows and the escape capacity that stores it smallest).
struct Corpus {
  gaac::KvDump dump;
  gaac::CalibrationTable table;
  std::vector<TiledTensor> parts;
  size_t bf16_bytes = 0;
};

const Corpus& corpus(int head_dim) {
  static std::map<int, std::unique_ptr<Corpus>> cache;
  auto& entry = cache[head_dim];
  if (!entry) {
    entry = std::make_unique<Corpus>();
    gaac::SyntheticKvSpec spec;
    spec.layers = 1;
    spec.kv_heads = kHeads;
    spec.head_dim = head_dim;
    spec.tokens = kLayerBf16Bytes / 2 / 2 / (kHeads * head_dim);
    spec.seed = 7;
    entry->dump = gaac::make_synthetic_kv(spec);
    const gaac::KvDump* dumps[] = {&entry->dump};
    entry->table = gaac::calibrate(dumps);
    for (const auto& [tensor, kind] : {std::pair{&entry->dump.layers[0].k, TensorKind::key},
                                       std::pair{&entry->dump.layers[0].v, TensorKind::value}}) {
      entry->parts.push_back({tensor, kind, gaac::tile_shape_for(kind, head_dim), &entry->table});
      entry->bf16_bytes += tensor->data.size() * sizeof(uint16_t);
    }
  }
  return *entry;
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
      const gaac::TileEncoding e = gaac::encode_tile(part.shape, src, part.stride(), part.tile_bases(i), part.capacity(),
                                                     std::span(enc.slots).subspan(tile * slot_bytes, slot_bytes), backend);
      enc.is_raw[tile] = !e.fits;
      if (!e.fits) copy_rows(src, part.stride(), enc.raw.data() + tile * part.shape.elements(), width, part.shape.channels);
      out.stored_bytes += e.fits ? slot_bytes : part.shape.raw_bytes();
    }
  }
  out.stored_bytes += c.table.bases_bytes();
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
      ok &= gaac::decode_tile(part.shape, std::span(enc.slots).subspan(tile * slot_bytes, slot_bytes), part.capacity(),
                              part.tile_bases(i), out, part.stride(), backend) == gaac::DecodeStatus::ok;
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

void BM_GaacEncode(benchmark::State& state, Backend backend) {
  if (skip_unavailable(state, backend)) return;
  const Corpus& c = corpus(static_cast<int>(state.range(0)));
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

void BM_GaacDecode(benchmark::State& state, Backend backend) {
  if (skip_unavailable(state, backend)) return;
  const Corpus& c = corpus(static_cast<int>(state.range(0)));
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

void BM_GeneralCompress(benchmark::State& state, General codec) {
  const Corpus& c = corpus(static_cast<int>(state.range(0)));
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

void BM_GeneralDecompress(benchmark::State& state, General codec) {
  const Corpus& c = corpus(static_cast<int>(state.range(0)));
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

void head_dims(benchmark::internal::Benchmark* b) { b->ArgName("head_dim")->Arg(128)->Arg(64)->Unit(benchmark::kMicrosecond); }

BENCHMARK_CAPTURE(BM_GaacEncode, scalar, Backend::scalar)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GaacEncode, avx2, Backend::avx2)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GaacDecode, scalar, Backend::scalar)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GaacDecode, avx2, Backend::avx2)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GeneralCompress, zstd1, General::zstd1)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GeneralCompress, zstd3, General::zstd3)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GeneralCompress, lz4, General::lz4)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GeneralDecompress, zstd1, General::zstd1)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GeneralDecompress, zstd3, General::zstd3)->Apply(head_dims);
BENCHMARK_CAPTURE(BM_GeneralDecompress, lz4, General::lz4)->Apply(head_dims);

}  // namespace

BENCHMARK_MAIN();
