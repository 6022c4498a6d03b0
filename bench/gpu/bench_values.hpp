// What the GPU benchmarks' C entry points (bench_capi.cpp: decode attention; codec_capi.cpp: the
// codec) share: the values of a case, host caches filled with them, and the error convention of
// the ctypes interface. Not a public API.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "gaac/calibration.hpp"
#include "gaac/fp8_dump.hpp"
#include "gaac/kv_cache.hpp"
#include "gaac/kv_dump.hpp"

namespace gaac::bench {

/// Message of the last failure of this thread (what gaac_bench_error returns).
std::string& last_error();

/// Runs `f`; returns 0, or -1 with the exception's message kept in last_error().
template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error() = e.what();
    return -1;
  }
}

/// Values and calibration of a case: a synthetic layer (calibrated on itself); one layer of a KV dump
/// (with its calibration table's layer, or calibrated on itself); or, when the dump's heads are half
/// as wide as the case's, heads made of two of the dump's (layer, head) pairs side by side — real KV
/// statistics in a shape no dumped model has — with the table's bases arranged the same way and
/// slot capacities chosen for the wider tiles.
void base_values(const std::string& source, int layer, const std::string& calibration, int kv_heads, int head_dim,
                 uint64_t seed, KvDump& out, CalibrationTable& table);

/// The one layer of `base` repeated along tokens to `tokens` tokens, starting at token `shift`.
KvDump tiled(const KvDump& base, int tokens, int shift);
/// The same for FP8 codes; the format and scales are carried over.
Fp8KvDump tiled(const Fp8KvDump& base, int tokens, int shift);

/// A cache of one layer holding each of `sequences` as one sequence, appended whole (complete blocks
/// encoded on every core), and their table.
KvCache fill(const std::vector<KvDump>& sequences, CacheFormat format, const CalibrationTable& table, int window,
             SequenceTable& batch);
/// The same for FP8 codes, in a cache of an FP8 format (gaac_fp8 or fp8) with the dumps' element format
/// and scales, `table` an FP8 table of that format.
KvCache fill(const std::vector<Fp8KvDump>& sequences, CacheFormat format, const CalibrationTable& table, int window,
             SequenceTable& batch);

}  // namespace gaac::bench
