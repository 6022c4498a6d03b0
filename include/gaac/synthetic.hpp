// Seeded synthetic KV that resembles a model's cache: Gaussian values with per-channel scales.
#pragma once

#include "gaac/export.h"

#include <cstdint>

#include "gaac/kv_dump.hpp"

namespace gaac {

/// Shape and seed of a synthetic KV dump.
struct GAAC_API SyntheticKvSpec {
  int layers = 4;
  int kv_heads = 2;
  int head_dim = 128;
  int tokens = 1000;
  uint64_t seed = 1;
};

/// Generates a dump whose every element is N(0, σ²) rounded to BF16, with σ drawn per
/// (layer, K/V, head, channel) from a log-normal law and rare outliers. Same spec, same bits, on
/// every platform (the generator uses no implementation-defined distribution). Throws gaac::Error for
/// layers or kv_heads below 1, negative tokens, a head_dim other than 64, 128 or 256, or a dump
/// larger than this machine's memory.
GAAC_API KvDump make_synthetic_kv(const SyntheticKvSpec& spec);

}  // namespace gaac
