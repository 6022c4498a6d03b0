// A small C entry point into gaac_cuda for the Python benchmark harness (ctypes on device pointers):
// fills the gaac::KvCache caches of one benchmark case (GAAC and its BF16 twin, or GAAC-FP8 and its FP8
// twin), copies them to the device and launches its paths. Not a public API: what the benchmark harness
// needs, nothing more.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_values.hpp"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/kv_dump.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tensor_view.hpp"

namespace {

using namespace gaac;
using namespace gaac::cuda;
using namespace gaac::bench;

/// One benchmark case: `copies` device copies of the same caches (rotated so the L2 never serves a
/// call from the previous one), the batch's sequence tables, the decode plans made so far. A BF16 case
/// holds a gaac cache and its bf16 twin, an FP8 case a gaac_fp8 cache and its fp8 twin.
struct BenchCase {
  int batch = 0, context = 0, kv_heads = 0, head_dim = 0, window = 0;
  std::vector<KvDump> sequences;         // a BF16 case's values, for export to the baselines
  std::vector<Fp8KvDump> fp8_sequences;  // an FP8 case's codes and scales, for export to the baselines
  std::vector<CacheMemory> gaac, twin, decompressed;  // decompressed: BF16 cases only
  std::unique_ptr<BatchTable> seqs, twin_seqs;
  // by (path, work, stages, warps, blocks_per_split, q_heads, heads_per_cta)
  std::map<std::array<int, 7>, DecodePlan> plans;
  int heads_per_cta = 0;  // DecodeConfig::heads_per_cta of the plans made next (gaac_bench_set_heads_per_cta)
  std::string describe;

  /// True for an FP8 case.
  bool fp8() const { return !fp8_sequences.empty(); }
};

/// Bytes of the units that the tiles attended by the batch's newest tokens occupy.
uint64_t attended_unit_bytes(const KvCache& cache, const SequenceTable& t, int window) {
  uint64_t bytes = 0;
  const PagedCacheView v = cache.view();
  const PagedGeometry& g = v.geometry;
  for (size_t s = 0; s < t.lengths.size(); ++s) {
    const int first = first_attended(t.lengths[s] - 1, window) / kTileTokens;
    for (int b = t.indptr[s] + first; b < t.indptr[s + 1]; ++b)
      for (int h = 0; h < g.kv_heads; ++h)
        for (const TensorKind kind : {TensorKind::key, TensorKind::value})
          for (int half = 0; half < g.halves(); ++half) {
            const uint32_t e = v.entries[g.entry_index(0, t.rows[static_cast<size_t>(b)], h, kind, half)];
            bytes += entry_class(e) == TileClass::compressed ? g.unit_bytes
                     : entry_class(e) == TileClass::raw      ? g.raw_tile_bytes()
                                                             : 0;
          }
  }
  return bytes;
}

/// The JSON of gaac_bench_describe: the compressed cache's unit size, escape capacity and tiles by
/// class (and the share of finalized tiles held raw), the bytes of units the attended tiles occupy in it
/// (`gaac_bytes`) and in the twin (`bf16_bytes` or `fp8_bytes`, after the twin's format), their ratio
/// (twin / compressed), an FP8 case's element format and scales, and the device.
std::string describe(const KvCache& gaac, const SequenceTable& t_gaac, const KvCache& twin, const SequenceTable& t_twin,
                     int window) {
  const CacheUsage usage = gaac.usage();
  const uint64_t gaac_bytes = attended_unit_bytes(gaac, t_gaac, window);
  const uint64_t twin_bytes = attended_unit_bytes(twin, t_twin, window);
  std::ostringstream js;
  js << "{\"unit_bytes\": " << gaac.geometry().unit_bytes << ", \"escape_capacity\": " << gaac.geometry().escape_capacity()
     << ", \"compressed_tiles\": " << usage.compressed_tiles << ", \"raw_tiles\": " << usage.raw_tiles
     << ", \"tail_tiles\": " << usage.tail_tiles << ", \"raw_fraction\": " << usage.raw_fraction()
     << ", \"gaac_bytes\": " << gaac_bytes << ", \"" << to_string(twin.format()) << "_bytes\": " << twin_bytes
     << ", \"ratio\": " << static_cast<double>(twin_bytes) / static_cast<double>(gaac_bytes);
  if (is_fp8(gaac.format()))
    js << ", \"element_format\": \"" << to_string(gaac.geometry().element_format) << "\", \"k_scale\": "
       << gaac.scale(0, TensorKind::key) << ", \"v_scale\": " << gaac.scale(0, TensorKind::value);
  js << ", \"device\": \"" << device_description() << "\"}";
  return js.str();
}

/// Fills the device side of `c` from its host caches (`gaac` compressed, `twin` its uncompressed twin,
/// with their sequence tables): `copies` uploads of each (and, for a BF16 case, as many caches for
/// decompress-first to write), the sequence tables, and the JSON of gaac_bench_describe.
void upload(BenchCase& c, const KvCache& gaac, const SequenceTable& t_gaac, const KvCache& twin,
            const SequenceTable& t_twin, int copies) {
  c.seqs = std::make_unique<BatchTable>(BatchTable::upload(t_gaac.view()));
  c.twin_seqs = std::make_unique<BatchTable>(BatchTable::upload(t_twin.view()));
  for (int i = 0; i < copies; ++i) {
    c.gaac.push_back(CacheMemory::upload(gaac));
    c.twin.push_back(CacheMemory::upload(twin));
    if (!c.fp8()) c.decompressed.push_back(CacheMemory::bf16_for(gaac.geometry(), c.window));
  }
  c.describe = describe(gaac, t_gaac, twin, t_twin, c.window);
}

/// "e4m3" or "e5m2" as an element format.
ElementFormat fp8_format(const std::string& name) {
  if (name == "e4m3") return ElementFormat::e4m3;
  if (name == "e5m2") return ElementFormat::e5m2;
  throw Error("bench: unknown FP8 format \"" + name + "\" (e4m3 or e5m2)");
}

/// Throws unless `path` is one of the case's paths: 0 to 3 (gaac_bench_run), 0 and 1 for an FP8 case.
void check_path(const BenchCase& c, int path) {
  if (path < 0 || path > 3) throw Error("bench: unknown path " + std::to_string(path));
  if (c.fp8() && path > 1) throw Error("bench: decompress-first (path " + std::to_string(path) + ") is for BF16 cases");
}

/// The plan of a path (0 GAAC or GAAC-FP8, 1 its twin, 2 the twin over the decompressed cache) for a
/// configuration, made on first use (host work and the workspace's allocation stay out of the timed calls).
const DecodePlan& plan_for(BenchCase& c, int path, int work, int stages, int warps, int blocks_per_split, int q_heads) {
  check_path(c, path);
  DecodePlan& plan = c.plans[{path, work, stages, warps, blocks_per_split, q_heads, c.heads_per_cta}];
  if (!plan.planned()) {
    DecodeConfig config;
    config.q_heads = q_heads;
    config.heads_per_cta = c.heads_per_cta;
    config.work = static_cast<Work>(work);
    config.stages = stages;
    config.warps = warps;
    config.blocks_per_split = blocks_per_split;
    const CacheMemory& cache = path == 0 ? c.gaac.at(0) : path == 1 ? c.twin.at(0) : c.decompressed.at(0);
    plan.plan(cache, path == 1 ? *c.twin_seqs : *c.seqs, config);
  }
  return plan;
}

}  // namespace

extern "C" {

/// Message of the last failure of this thread.
const char* gaac_bench_error() { return last_error().c_str(); }

/// Builds a case: `batch` sequences of `context` tokens, `kv_heads` heads of width `head_dim`, values
/// from `source` ("synthetic", or a KV dump: its layer `layer`, or heads of half the width paired up),
/// calibrated with the table at `calibration` or, when empty, on the values themselves; each sequence
/// is the values tiled along tokens. Returns null on failure (see gaac_bench_error).
void* gaac_bench_create(int batch, int context, int kv_heads, int head_dim, const char* source, int layer,
                        const char* calibration, uint64_t seed, int window, int copies) {
  auto c = std::make_unique<BenchCase>();
  const int status = guarded([&] {
    c->batch = batch, c->context = context, c->kv_heads = kv_heads, c->head_dim = head_dim, c->window = window;
    KvDump base;
    CalibrationTable table;
    base_values(source, layer, calibration ? calibration : "", kv_heads, head_dim, seed, base, table);
    for (int s = 0; s < batch; ++s) c->sequences.push_back(tiled(base, context, 1237 * s));
    SequenceTable t_gaac, t_bf16;
    const KvCache h_gaac = fill(c->sequences, CacheFormat::gaac, table, window, t_gaac);
    const KvCache h_bf16 = fill(c->sequences, CacheFormat::bf16, table, window, t_bf16);
    upload(*c, h_gaac, t_gaac, h_bf16, t_bf16, copies);
  });
  return status == 0 ? c.release() : nullptr;
}

/// Builds an FP8 case: the values gaac_bench_create takes from `source` (the dump's own values, calibrated
/// on themselves where that matters), converted to FP8 of `element_format` ("e4m3" or "e5m2") with a
/// per-tensor scale for K and one for V (fp8_per_tensor_scale, as vLLM's FP8 cache), tiled along tokens
/// as in a BF16 case, and held by a gaac_fp8 cache, calibrated with an FP8 table learnt on those codes,
/// and by its fp8 twin. Its paths 0 and 1 are GAAC-FP8 and the FP8 twin; decompress-first (2, 3) is for
/// BF16 cases only. Returns null on failure (see gaac_bench_error).
void* gaac_bench_create_fp8(int batch, int context, int kv_heads, int head_dim, const char* source, int layer,
                            uint64_t seed, int window, int copies, const char* element_format) {
  auto c = std::make_unique<BenchCase>();
  const int status = guarded([&] {
    const ElementFormat element = fp8_format(element_format);
    c->batch = batch, c->context = context, c->kv_heads = kv_heads, c->head_dim = head_dim, c->window = window;
    KvDump base;
    CalibrationTable bf16_table;
    base_values(source, layer, "", kv_heads, head_dim, seed, base, bf16_table);
    const Fp8KvDump codes = convert_to_fp8(base, element, Fp8Scaling::per_tensor);
    const Fp8KvDump* learnt_on = &codes;
    const CalibrationTable table = calibrate(std::span<const Fp8KvDump* const>(&learnt_on, 1));
    for (int s = 0; s < batch; ++s) c->fp8_sequences.push_back(tiled(codes, context, 1237 * s));
    SequenceTable t_gaac, t_fp8;
    const KvCache h_gaac = fill(c->fp8_sequences, CacheFormat::gaac_fp8, table, window, t_gaac);
    const KvCache h_fp8 = fill(c->fp8_sequences, CacheFormat::fp8, table, window, t_fp8);
    upload(*c, h_gaac, t_gaac, h_fp8, t_fp8, copies);
  });
  return status == 0 ? c.release() : nullptr;
}

/// JSON describing the case: tile counts, unit size, bytes each path's tiles occupy and their ratio, an FP8
/// case's element format and scales, the device.
const char* gaac_bench_describe(void* handle) { return static_cast<BenchCase*>(handle)->describe.c_str(); }

/// Copies a BF16 case's values to host arrays `k` and `v`, `[batch][context][kv_heads][head_dim]` BF16.
int gaac_bench_export(void* handle, uint16_t* k, uint16_t* v) {
  return guarded([&] {
    const BenchCase& c = *static_cast<BenchCase*>(handle);
    if (c.fp8()) throw Error("bench: an FP8 case exports its codes with gaac_bench_export_fp8");
    const size_t per = static_cast<size_t>(c.context) * c.kv_heads * c.head_dim;
    for (int s = 0; s < c.batch; ++s) {
      std::memcpy(k + s * per, c.sequences[static_cast<size_t>(s)].layers[0].k.data.data(), per * 2);
      std::memcpy(v + s * per, c.sequences[static_cast<size_t>(s)].layers[0].v.data.data(), per * 2);
    }
  });
}

/// Copies an FP8 case's codes to host arrays `k` and `v`, `[batch][context][kv_heads][head_dim]` bytes of
/// its element format, and its scales to `scales[0]` (K) and `scales[1]` (V): code x stands for its value
/// times the scale.
int gaac_bench_export_fp8(void* handle, uint8_t* k, uint8_t* v, float* scales) {
  return guarded([&] {
    const BenchCase& c = *static_cast<BenchCase*>(handle);
    if (!c.fp8()) throw Error("bench: a BF16 case exports its values with gaac_bench_export");
    const size_t per = static_cast<size_t>(c.context) * c.kv_heads * c.head_dim;
    for (int s = 0; s < c.batch; ++s) {
      std::memcpy(k + s * per, c.fp8_sequences[static_cast<size_t>(s)].layers[0].k.data.data(), per);
      std::memcpy(v + s * per, c.fp8_sequences[static_cast<size_t>(s)].layers[0].v.data.data(), per);
    }
    scales[0] = c.fp8_sequences.front().k_scales.at(0);
    scales[1] = c.fp8_sequences.front().v_scales.at(0);
  });
}

/// Runs one path on copy `copy`: 0 the fused GAAC kernel, 1 the BF16 twin, 2 decompress-first
/// (decompress, then the twin on the result), 3 the decompression alone; on an FP8 case 0 GAAC-FP8 and
/// 1 the FP8 twin (the same kernels over FP8 codes). `work` selects a breakdown
/// variant (gaac::cuda::Work), `stages`, `warps` and `blocks_per_split` override the kernel's defaults
/// when nonzero. `q` and `out` are device pointers `[batch][q_heads][head_dim]` BF16; `stream` a
/// cudaStream_t (0: default). Writes the split used to `*used_blocks_per_split` when not null.
int gaac_bench_run(void* handle, int copy, int path, int work, int stages, int warps, int blocks_per_split, int q_heads,
                   const void* q, void* out, void* stream, int* used_blocks_per_split) {
  return guarded([&] {
    BenchCase& c = *static_cast<BenchCase*>(handle);
    check_path(c, path);
    const size_t i = static_cast<size_t>(copy);
    const auto qp = static_cast<const uint16_t*>(q);
    const auto op = static_cast<uint16_t*>(out);
    const auto st = static_cast<Stream>(stream);
    if (path == 2 || path == 3) decompress(c.gaac.at(i), *c.seqs, 0, c.decompressed.at(i), st);
    if (path == 3) return;
    const DecodePlan& plan = plan_for(c, path, work, stages, warps, blocks_per_split, q_heads);
    const CacheMemory& cache = path == 0 ? c.gaac.at(i) : path == 1 ? c.twin.at(i) : c.decompressed.at(i);
    plan.run(cache, path == 1 ? *c.twin_seqs : *c.seqs, 0, qp, op, 0.0f, st);
    if (used_blocks_per_split) *used_blocks_per_split = plan.split(0).blocks_per_split;
  });
}

/// The split plan of a path (0 GAAC or GAAC-FP8, 1 its twin) as JSON, written to `buffer` (`size` bytes).
int gaac_bench_plan(void* handle, int path, int work, int stages, int warps, int q_heads, char* buffer, int size) {
  return guarded([&] {
    BenchCase& c = *static_cast<BenchCase*>(handle);
    const DecodeSplit& p = plan_for(c, path, work, stages, warps, 0, q_heads).split(0);
    const std::string js = "{\"blocks_per_split\": " + std::to_string(p.blocks_per_split) +
                           ", \"max_splits\": " + std::to_string(p.max_splits) + ", \"ctas_per_sm\": " +
                           std::to_string(p.ctas_per_sm) + ", \"shared_bytes\": " + std::to_string(p.shared_bytes) +
                           ", \"warps\": " + std::to_string(p.warps) + ", \"stages\": " + std::to_string(p.stages) + "}";
    std::snprintf(buffer, static_cast<size_t>(size), "%s", js.c_str());
  });
}

/// Sets DecodeConfig::heads_per_cta for the runs and plans that follow (0: every query head of a KV head in
/// one CTA; 8: groups of 9-16 split over CTAs). A separate call, so that the runs keep one signature across
/// kernel versions compared in one process.
int gaac_bench_set_heads_per_cta(void* handle, int heads_per_cta) {
  return guarded([&] { static_cast<BenchCase*>(handle)->heads_per_cta = heads_per_cta; });
}

/// Frees a case.
void gaac_bench_free(void* handle) { delete static_cast<BenchCase*>(handle); }

}  // extern "C"
