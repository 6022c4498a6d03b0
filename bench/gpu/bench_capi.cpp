// A small C entry point into gaac_cuda for the Python benchmark harness (ctypes on device pointers):
// fills the gaac::KvCache caches of one benchmark case (GAAC and BF16), copies them to the device and
// launches its paths. Not a public API: what the benchmark harness needs, nothing more.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_values.hpp"
#include "gaac/calibration.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/kv_dump.hpp"
#include "gaac/synthetic.hpp"
#include "gaac/tensor_view.hpp"

namespace {

using namespace gaac;
using namespace gaac::cuda;
using namespace gaac::bench;

/// One benchmark case: `copies` device copies of the same caches (rotated so the L2 never serves a
/// call from the previous one), the batch's sequence table, the decode plans made so far.
struct BenchCase {
  int batch = 0, context = 0, kv_heads = 0, head_dim = 0, window = 0;
  std::vector<KvDump> sequences;  // the values, for export to the baselines
  std::vector<CacheMemory> gaac, bf16, decompressed;
  std::unique_ptr<BatchTable> seqs, bf16_seqs;
  // by (path, work, stages, warps, blocks_per_split, q_heads, heads_per_cta)
  std::map<std::array<int, 7>, DecodePlan> plans;
  int heads_per_cta = 0;  // DecodeConfig::heads_per_cta of the plans made next (gaac_bench_set_heads_per_cta)
  CacheUsage usage;
  uint32_t unit_bytes = 0;
  uint64_t gaac_bytes = 0, bf16_bytes = 0;  // bytes of units the attended tiles occupy
  std::string describe;
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
    c->usage = h_gaac.usage();
    c->unit_bytes = h_gaac.geometry().unit_bytes;
    c->gaac_bytes = attended_unit_bytes(h_gaac, t_gaac, window);
    c->bf16_bytes = attended_unit_bytes(h_bf16, t_bf16, window);
    c->seqs = std::make_unique<BatchTable>(BatchTable::upload(t_gaac.view()));
    c->bf16_seqs = std::make_unique<BatchTable>(BatchTable::upload(t_bf16.view()));
    for (int i = 0; i < copies; ++i) {
      c->gaac.push_back(CacheMemory::upload(h_gaac));
      c->bf16.push_back(CacheMemory::upload(h_bf16));
      c->decompressed.push_back(CacheMemory::bf16_for(h_gaac.geometry(), window));
    }
    std::ostringstream js;
    js << "{\"unit_bytes\": " << c->unit_bytes << ", \"escape_capacity\": " << h_gaac.geometry().escape_capacity()
       << ", \"compressed_tiles\": " << c->usage.compressed_tiles << ", \"raw_tiles\": " << c->usage.raw_tiles
       << ", \"tail_tiles\": " << c->usage.tail_tiles
       << ", \"gaac_bytes\": " << c->gaac_bytes << ", \"bf16_bytes\": " << c->bf16_bytes
       << ", \"device\": \"" << device_description() << "\"}";
    c->describe = js.str();
  });
  return status == 0 ? c.release() : nullptr;
}

/// JSON describing the case (tile counts, unit size, bytes each path's tiles occupy, device).
const char* gaac_bench_describe(void* handle) { return static_cast<BenchCase*>(handle)->describe.c_str(); }

/// Copies the values to host arrays `k` and `v`, `[batch][context][kv_heads][head_dim]` BF16.
int gaac_bench_export(void* handle, uint16_t* k, uint16_t* v) {
  return guarded([&] {
    const BenchCase& c = *static_cast<BenchCase*>(handle);
    const size_t per = static_cast<size_t>(c.context) * c.kv_heads * c.head_dim;
    for (int s = 0; s < c.batch; ++s) {
      std::memcpy(k + s * per, c.sequences[static_cast<size_t>(s)].layers[0].k.data.data(), per * 2);
      std::memcpy(v + s * per, c.sequences[static_cast<size_t>(s)].layers[0].v.data.data(), per * 2);
    }
  });
}

/// The plan of a path (0 GAAC, 1 twin, 2 the twin over the decompressed cache) for a configuration,
/// made on first use (host work and the workspace's allocation stay out of the timed calls).
const DecodePlan& plan_for(BenchCase& c, int path, int work, int stages, int warps, int blocks_per_split, int q_heads) {
  DecodePlan& plan = c.plans[{path, work, stages, warps, blocks_per_split, q_heads, c.heads_per_cta}];
  if (!plan.planned()) {
    DecodeConfig config;
    config.q_heads = q_heads;
    config.heads_per_cta = c.heads_per_cta;
    config.work = static_cast<Work>(work);
    config.stages = stages;
    config.warps = warps;
    config.blocks_per_split = blocks_per_split;
    const CacheMemory& cache = path == 0 ? c.gaac.at(0) : path == 1 ? c.bf16.at(0) : c.decompressed.at(0);
    plan.plan(cache, path == 1 ? *c.bf16_seqs : *c.seqs, config);
  }
  return plan;
}

/// Runs one path on copy `copy`: 0 the fused GAAC kernel, 1 the BF16 twin, 2 decompress-first
/// (decompress, then the twin on the result), 3 the decompression alone. `work` selects a breakdown
/// variant (gaac::cuda::Work), `stages`, `warps` and `blocks_per_split` override the kernel's defaults
/// when nonzero. `q` and `out` are device pointers `[batch][q_heads][head_dim]` BF16; `stream` a
/// cudaStream_t (0: default). Writes the split used to `*used_blocks_per_split` when not null.
int gaac_bench_run(void* handle, int copy, int path, int work, int stages, int warps, int blocks_per_split, int q_heads,
                   const void* q, void* out, void* stream, int* used_blocks_per_split) {
  return guarded([&] {
    BenchCase& c = *static_cast<BenchCase*>(handle);
    if (path < 0 || path > 3) throw Error("bench: unknown path " + std::to_string(path));
    const size_t i = static_cast<size_t>(copy);
    const auto qp = static_cast<const uint16_t*>(q);
    const auto op = static_cast<uint16_t*>(out);
    const auto st = static_cast<Stream>(stream);
    if (path == 2 || path == 3) decompress(c.gaac.at(i), *c.seqs, 0, c.decompressed.at(i), st);
    if (path == 3) return;
    const DecodePlan& plan = plan_for(c, path, work, stages, warps, blocks_per_split, q_heads);
    const CacheMemory& cache = path == 0 ? c.gaac.at(i) : path == 1 ? c.bf16.at(i) : c.decompressed.at(i);
    plan.run(cache, path == 1 ? *c.bf16_seqs : *c.seqs, 0, qp, op, 0.0f, st);
    if (used_blocks_per_split) *used_blocks_per_split = plan.split(0).blocks_per_split;
  });
}

/// The split plan of a path (0 GAAC, 1 twin) as JSON, written to `buffer` (`size` bytes).
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
