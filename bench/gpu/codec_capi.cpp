// C entry points for the GPU codec benchmark (bench_codecs.py, ctypes on device pointers): one layer
// of KV on the device, GPU finalize of open blocks (armed again from a pristine copy before each
// timed call), decompression of the whole layer to [tokens, heads, dim], .gaac encoding on the GPU.
// Not a public API.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_values.hpp"
#include "cuda/check.hpp"
#include "gaac/cuda.hpp"
#include "gaac/error.hpp"
#include "gaac/snapshot.hpp"
#include "gaac/tensor_view.hpp"

namespace {

using namespace gaac;
using namespace gaac::cuda;
using namespace gaac::bench;

/// A device cache holding `blocks` open blocks whose 16th token is written but not yet finalized,
/// and a pristine copy of its memory to arm it again after a finalize.
struct ArmedCopy {
  CacheMemory cache;
  DeviceBuffer units, entries, free_stack, free_count;
};

/// `blocks` sequences of one open block each (block i: tokens 16i .. 16i+15 of the values), on the
/// host before and after their 16th token, and device copies armed with the 16th token.
struct Armed {
  int blocks = 0;
  std::unique_ptr<KvCache> finalized;
  std::vector<ArmedCopy> copies;
  DeviceBuffer rows;
};

struct CodecCase {
  KvDump values;
  CalibrationTable table;
  std::unique_ptr<KvCache> host;  // the whole layer as one sequence
  std::unique_ptr<CacheMemory> device;
  std::unique_ptr<BatchTable> seqs;
  DeviceBuffer dense_k, dense_v;
  Armed armed;
  std::string describe;
};

/// Block i of the values (tokens 16i .. 16i+15, wrapping), `count` tokens from its start.
KvDump block_of(const KvDump& values, int i, int count) {
  KvDump d;
  d.layers.resize(1);
  const int tokens = values.layers[0].k.tokens;
  const int first = (i * kTileTokens) % (tokens - kTileTokens + 1);
  for (const TensorKind kind : {TensorKind::key, TensorKind::value}) {
    const KvTensor& src = values.layers[0].of(kind);
    KvTensor& dst = d.layers[0].of(kind);
    const size_t row = static_cast<size_t>(src.kv_heads) * src.head_dim;
    dst = {count, src.kv_heads, src.head_dim,
           std::vector<uint16_t>(src.data.begin() + static_cast<std::ptrdiff_t>(first * row),
                                 src.data.begin() + static_cast<std::ptrdiff_t>((first + count) * row))};
  }
  return d;
}

void arm(CodecCase& c, int blocks, int copies) {
  Armed& a = c.armed;
  if (a.blocks == blocks && static_cast<int>(a.copies.size()) >= copies) {
    for (ArmedCopy& copy : a.copies) {
      const size_t pool = static_cast<size_t>(copy.cache.units()) * copy.cache.geometry().unit_bytes;
      check(cudaMemcpy(copy.cache.view().units, copy.units.data(), pool, cudaMemcpyDeviceToDevice), "re-arm");
      check(cudaMemcpy(copy.cache.view().entries, copy.entries.data(), copy.entries.bytes(), cudaMemcpyDeviceToDevice), "re-arm");
      check(cudaMemcpy(copy.cache.view().free_stack, copy.free_stack.data(), copy.free_stack.bytes(), cudaMemcpyDeviceToDevice),
            "re-arm");
      check(cudaMemcpy(copy.cache.view().free_count, copy.free_count.data(), 4, cudaMemcpyDeviceToDevice), "re-arm");
    }
    return;
  }
  a = Armed();
  CacheConfig config;
  config.geometry = {1, c.values.kv_heads(), c.values.head_dim(), {0}};
  config.format = CacheFormat::gaac;
  config.calibration = &c.table;
  config.budget_bytes = worst_case_budget(config.geometry, CacheFormat::gaac, &c.table, kTileTokens, blocks + 1);
  KvCache open(config);
  a.finalized = std::make_unique<KvCache>(config);
  std::vector<uint32_t> rows;
  std::vector<SequenceId> ids;
  for (int i = 0; i < blocks; ++i) {
    const KvDump d = block_of(c.values, i, kTileTokens);
    const KvView k15[] = {view_of(d.layers[0].k).tokens_from(0, kTileTokens - 1)};
    const KvView v15[] = {view_of(d.layers[0].v).tokens_from(0, kTileTokens - 1)};
    const SequenceId id = open.add_sequence();
    if (open.append(id, k15, v15).status != CacheStatus::ok) throw Error("bench: the open cache is full");
    // The reference: the same cache, given each block's 16th token by KvCache::append afterwards.
    if (a.finalized->append(a.finalized->add_sequence(), k15, v15).status != CacheStatus::ok)
      throw Error("bench: the reference cache is full");
    rows.push_back(open.sequence_table(std::span(&id, 1)).rows.back());
    ids.push_back(id);
  }
  for (int i = 0; i < blocks; ++i) {
    const KvDump d = block_of(c.values, i, kTileTokens);
    const KvView k1[] = {view_of(d.layers[0].k).tokens_from(kTileTokens - 1, 1)};
    const KvView v1[] = {view_of(d.layers[0].v).tokens_from(kTileTokens - 1, 1)};
    if (a.finalized->append(ids[static_cast<size_t>(i)], k1, v1).status != CacheStatus::ok)
      throw Error("bench: the reference cache is full");
  }
  // The pool with every open block's 16th token written into its tail (row 7 of the second unit).
  const PagedCacheView v = open.view();
  const PagedGeometry& g = v.geometry;
  const uint32_t device_units = CacheMemory::upload(open).units();  // the part of the pool a device copy holds
  std::vector<uint8_t> pool(v.units, v.units + static_cast<size_t>(g.unit_bytes) * device_units);
  const size_t row_bytes = static_cast<size_t>(g.tile_channels()) * 2;
  for (int i = 0; i < blocks; ++i) {
    const KvDump d = block_of(c.values, i, kTileTokens);
    for (int h = 0; h < g.kv_heads; ++h)
      for (const TensorKind kind : {TensorKind::key, TensorKind::value})
        for (int half = 0; half < g.halves(); ++half) {
          const uint32_t e = v.entries[g.entry_index(0, rows[static_cast<size_t>(i)], h, kind, half)];
          uint32_t second = 0;
          std::memcpy(&second, pool.data() + g.unit_offset(entry_unit(e)) + g.partner_offset(), 4);
          const KvTensor& t = d.layers[0].of(kind);
          std::memcpy(pool.data() + g.unit_offset(second) + 7 * row_bytes,
                      t.data.data() + (static_cast<size_t>(kTileTokens - 1) * t.kv_heads + h) * t.head_dim +
                          static_cast<size_t>(half) * g.tile_channels(),
                      row_bytes);
        }
  }
  for (int i = 0; i < copies; ++i) {
    ArmedCopy copy{CacheMemory::upload(open), {}, {}, {}, {}};
    const size_t bytes = static_cast<size_t>(copy.cache.units()) * g.unit_bytes;
    check(cudaMemcpy(copy.cache.view().units, pool.data(), bytes, cudaMemcpyHostToDevice), "arm");
    copy.units = DeviceBuffer(bytes);
    check(cudaMemcpy(copy.units.data(), copy.cache.view().units, bytes, cudaMemcpyDeviceToDevice), "arm");
    copy.entries = DeviceBuffer(g.table_entries() * 4);
    check(cudaMemcpy(copy.entries.data(), copy.cache.view().entries, copy.entries.bytes(), cudaMemcpyDeviceToDevice), "arm");
    copy.free_stack = DeviceBuffer(static_cast<size_t>(std::max<uint32_t>(copy.cache.units(), 1)) * 4);
    check(cudaMemcpy(copy.free_stack.data(), copy.cache.view().free_stack, copy.free_stack.bytes(), cudaMemcpyDeviceToDevice),
          "arm");
    copy.free_count = DeviceBuffer(4);
    check(cudaMemcpy(copy.free_count.data(), copy.cache.view().free_count, 4, cudaMemcpyDeviceToDevice), "arm");
    a.copies.push_back(std::move(copy));
  }
  a.rows = DeviceBuffer(rows.size() * 4);
  a.rows.upload(rows.data(), rows.size() * 4);
  a.blocks = blocks;
}

}  // namespace

extern "C" {

/// One layer of KV on the device: `source` "synthetic" or a KV dump (its layer `layer`, or heads of
/// half the width paired up), calibrated with `calibration` (or on the values when empty), tiled to
/// `tokens` tokens. Returns null on failure (see gaac_bench_error).
void* gaac_codec_open(const char* source, int layer, const char* calibration, int tokens, int kv_heads, int head_dim,
                      uint64_t seed) {
  auto c = std::make_unique<CodecCase>();
  const int status = guarded([&] {
    if (tokens < kTileTokens || tokens % kTileTokens != 0) throw Error("bench: tokens must be a positive multiple of 16");
    KvDump base;
    base_values(source, layer, calibration ? calibration : "", kv_heads, head_dim, seed, base, c->table);
    c->values = tiled(base, tokens, 0);
    SequenceTable batch;
    c->host = std::make_unique<KvCache>(fill({c->values}, CacheFormat::gaac, c->table, 0, batch));
    c->device = std::make_unique<CacheMemory>(CacheMemory::upload(*c->host));
    c->seqs = std::make_unique<BatchTable>(BatchTable::upload(batch.view()));
    const KvTensor& k = c->values.layers[0].k;
    c->dense_k = DeviceBuffer(k.data.size() * 2);
    c->dense_k.upload(k.data.data(), k.data.size() * 2);
    c->dense_v = DeviceBuffer(k.data.size() * 2);
    c->dense_v.upload(c->values.layers[0].v.data.data(), k.data.size() * 2);
    const CacheUsage u = c->host->usage();
    const PagedGeometry& g = c->host->geometry();
    const uint64_t bf16 = 2 * k.data.size() * 2;
    const uint64_t packed = u.compressed_tiles * g.unit_bytes - u.unused_slot_bytes + u.raw_tiles * g.raw_tile_bytes();
    const uint64_t resident = u.resident_bytes();
    std::ostringstream js;
    js << "{\"tokens\": " << tokens << ", \"kv_heads\": " << kv_heads << ", \"head_dim\": " << head_dim
       << ", \"bf16_bytes\": " << bf16 << ", \"packed_bytes\": " << packed << ", \"resident_bytes\": " << resident
       << ", \"codec_ratio\": " << static_cast<double>(bf16) / static_cast<double>(packed)
       << ", \"resident_ratio\": " << static_cast<double>(bf16) / static_cast<double>(resident)
       << ", \"tiles\": " << u.compressed_tiles + u.raw_tiles << ", \"raw_tiles\": " << u.raw_tiles
       << ", \"unit_bytes\": " << g.unit_bytes << ", \"device\": \"" << device_description() << "\"}";
    c->describe = js.str();
  });
  return status == 0 ? c.release() : nullptr;
}

/// JSON: tokens, heads, width, BF16 bytes of K and V, packed and resident bytes and ratios, tiles.
const char* gaac_codec_describe(void* h) { return static_cast<CodecCase*>(h)->describe.c_str(); }

/// Copies K (kind 0) or V (kind 1), `[tokens, kv_heads, head_dim]` BF16, to device memory `dst`.
int gaac_codec_copy_dense(void* h, int kind, void* dst, void* stream) {
  return guarded([&] {
    const CodecCase& c = *static_cast<CodecCase*>(h);
    const DeviceBuffer& src = kind == 0 ? c.dense_k : c.dense_v;
    check(cudaMemcpyAsync(dst, src.data(), src.bytes(), cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
          "copy_dense");
  });
}

/// Prepares `copies` device caches holding `blocks` open blocks each, their 16th token written
/// (again from their pristine copies when already built). Synchronous; not for timing.
int gaac_codec_arm(void* h, int blocks, int copies, void* stream) {
  (void)stream;
  return guarded([&] {
    if (blocks < 1 || copies < 1) throw Error("bench: arm needs at least one block and one copy");
    arm(*static_cast<CodecCase*>(h), blocks, copies);
  });
}

/// GPU finalize of the armed blocks of copy `copy` (asynchronous on `stream`).
int gaac_codec_finalize(void* h, int blocks, int copy, void* stream) {
  return guarded([&] {
    Armed& a = static_cast<CodecCase*>(h)->armed;
    if (a.blocks != blocks) throw Error("bench: finalize of " + std::to_string(blocks) + " blocks, armed for " + std::to_string(a.blocks));
    finalize_blocks(a.copies.at(static_cast<size_t>(copy)).cache, static_cast<const uint32_t*>(a.rows.data()), blocks, 0, 1,
                    static_cast<Stream>(stream));
  });
}

/// 0 when copy `copy`, finalized, holds the host cache's bytes after the same blocks' 16th token
/// (block table, every unit in use, free units); -1 naming the first difference otherwise.
int gaac_codec_finalize_check(void* h, int blocks, int copy) {
  return guarded([&] {
    Armed& a = static_cast<CodecCase*>(h)->armed;
    if (a.blocks != blocks) throw Error("bench: check of " + std::to_string(blocks) + " blocks, armed for " + std::to_string(a.blocks));
    const CacheMemory& d = a.copies.at(static_cast<size_t>(copy)).cache;
    check(cudaDeviceSynchronize(), "finalize");
    std::vector<uint8_t> units;
    std::vector<uint32_t> entries;
    d.download(units, entries);
    const PagedCacheView want = a.finalized->view();
    const PagedGeometry& g = want.geometry;
    for (size_t i = 0; i < g.table_entries(); ++i) {
      if (entries[i] != want.entries[i]) throw Error("finalize check: entry " + std::to_string(i) + " differs");
      if (entry_class(entries[i]) == TileClass::absent) continue;
      const uint32_t u = entry_unit(entries[i]);
      if (std::memcmp(units.data() + g.unit_offset(u), want.units + g.unit_offset(u), g.unit_bytes) != 0)
        throw Error("finalize check: unit " + std::to_string(u) + " of entry " + std::to_string(i) + " differs");
    }
  });
}

/// Decompresses the whole layer into device arrays `out_k`, `out_v`: `[tokens, kv_heads, head_dim]`.
int gaac_codec_decompress(void* h, void* out_k, void* out_v, void* stream) {
  return guarded([&] {
    CodecCase& c = *static_cast<CodecCase*>(h);
    DenseLayout out;
    out.k = static_cast<uint16_t*>(out_k);
    out.v = static_cast<uint16_t*>(out_v);
    out.head_stride = c.values.head_dim();
    out.token_stride = static_cast<int64_t>(c.values.kv_heads()) * c.values.head_dim();
    out.outer_stride = out.token_stride * c.values.layers[0].k.tokens;
    decompress_dense(*c.device, *c.seqs, 0, 1, out, static_cast<Stream>(stream));
  });
}

/// The layer as a .gaac image, encoded by the CPU and by the GPU: checks the bytes are equal and
/// writes the wall time of each (µs, transfers included for the GPU) and the image's size.
int gaac_codec_snapshot(void* h, double* cpu_us, double* gpu_us, uint64_t* bytes) {
  return guarded([&] {
    const CodecCase& c = *static_cast<CodecCase*>(h);
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const std::vector<uint8_t> cpu = gaac::snapshot_image(c.values, c.table);
    const auto t1 = clock::now();
    const std::vector<uint8_t> gpu = cuda::snapshot_image(c.values, c.table);
    const auto t2 = clock::now();
    if (cpu != gpu) throw Error("snapshot: the GPU's .gaac image differs from the CPU's");
    *cpu_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    *gpu_us = std::chrono::duration<double, std::micro>(t2 - t1).count();
    *bytes = gpu.size();
  });
}

/// Frees a case.
void gaac_codec_close(void* h) { delete static_cast<CodecCase*>(h); }

}  // extern "C"
