// XXH64 (seed 0 or any) for the device: the KV chunk objects' checksums (docs/format.md, section 15).
// Written from the algorithm's specification; plain integer code that compiles for the host too, where
// a test checks it against libxxhash on every length. Reads `data` with 8-byte loads from its start:
// the pointer must be 8-byte aligned.
//
// XXH64's stripe loop keeps four accumulators that never mix until the end, so four threads (a quad of
// a warp) run one each over the same bytes: quad_xxh64. accumulate() loads the words of kBatch stripes
// before their rounds; through the read-only data cache (kReadOnly) ptxas keeps about ten loads
// in flight ahead of the rounds (plain loads: four), so a thread waits for memory about once a batch.
// quad_xxh64_staged is the same hash with the warp's reads coalesced (for many pieces at once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GAAC_XXH_INLINE __host__ __device__ __forceinline__
#else
#define GAAC_XXH_INLINE inline
#endif

namespace gaac::cuda::xxh {

inline constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
inline constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr uint64_t kPrime3 = 0x165667B19E3779F9ull;
inline constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
inline constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ull;
/// Bytes of one stripe: a word for each of the four accumulators.
inline constexpr size_t kStripe = 32;
/// Stripes whose words a thread loads before it runs their rounds.
inline constexpr size_t kBatch = 32;

GAAC_XXH_INLINE uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

GAAC_XXH_INLINE uint64_t round(uint64_t acc, uint64_t input) { return rotl(acc + input * kPrime2, 31) * kPrime1; }

GAAC_XXH_INLINE uint64_t merge(uint64_t acc, uint64_t value) { return (acc ^ round(0, value)) * kPrime1 + kPrime4; }

/// Little-endian words at an aligned address (the device and x86 are little-endian); on the device
/// through the read-only data cache when `kReadOnly`: only for bytes no thread writes while the kernel
/// runs (that cache does not see them).
template <bool kReadOnly = false>
GAAC_XXH_INLINE uint64_t load64(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (kReadOnly) return __ldg(reinterpret_cast<const unsigned long long*>(p));
#endif
  return *reinterpret_cast<const uint64_t*>(p);
}
GAAC_XXH_INLINE uint32_t load32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

/// Accumulator `which` (0..3: v1..v4) of XXH64 with `seed` after the stripe loop over the first
/// `stripes` stripes at `data` (8-byte aligned): the rounds of word `which` of every stripe.
template <bool kReadOnly = false>
GAAC_XXH_INLINE uint64_t accumulate(const uint8_t* data, size_t stripes, int which, uint64_t seed) {
  uint64_t v = which == 0 ? seed + kPrime1 + kPrime2 : which == 1 ? seed + kPrime2 : which == 2 ? seed : seed - kPrime1;
  const uint8_t* p = data + 8 * which;
  size_t i = 0;
  for (; i + kBatch <= stripes; i += kBatch) {
    uint64_t words[kBatch];
    for (size_t k = 0; k < kBatch; ++k) words[k] = load64<kReadOnly>(p + kStripe * (i + k));
    for (size_t k = 0; k < kBatch; ++k) v = round(v, words[k]);
  }
  for (; i < stripes; ++i) v = round(v, load64<kReadOnly>(p + kStripe * i));
  return v;
}

/// XXH64 of `length` bytes at `data` with `seed`, given the four accumulators of its stripe loop
/// (`v`, unused when `length` < 32): their convergence, the last `length` mod 32 bytes, the avalanche.
GAAC_XXH_INLINE uint64_t finish(const uint64_t (&v)[4], const uint8_t* data, size_t length, uint64_t seed) {
  uint64_t h;
  if (length >= kStripe) {
    h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
    for (int k = 0; k < 4; ++k) h = merge(h, v[k]);
  } else {
    h = seed + kPrime5;
  }
  h += static_cast<uint64_t>(length);
  const uint8_t* p = data + length / kStripe * kStripe;
  const uint8_t* end = data + length;
  for (; p + 8 <= end; p += 8) h = rotl(h ^ round(0, load64(p)), 27) * kPrime1 + kPrime4;
  if (p + 4 <= end) {
    h = rotl(h ^ (static_cast<uint64_t>(load32(p)) * kPrime1), 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) h = rotl(h ^ (static_cast<uint64_t>(*p) * kPrime5), 11) * kPrime1;
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

/// XXH64 of `length` bytes at `data` (8-byte aligned) with `seed`, by one thread.
GAAC_XXH_INLINE uint64_t xxh64(const uint8_t* data, size_t length, uint64_t seed) {
  uint64_t v[4] = {};
  for (int k = 0; length >= kStripe && k < 4; ++k) v[k] = accumulate(data, length / kStripe, k, seed);
  return finish(v, data, length, seed);
}

#if defined(__CUDACC__)
/// XXH64 of `length` bytes at `data` (8-byte aligned) with `seed`, by the quad of lanes 4q .. 4q + 3
/// holding the calling lane (`lane` its lane in the warp): each runs one accumulator, and every lane
/// of the quad returns the hash. All 32 lanes of the warp must call it together (each quad with its
/// own bytes, or none: `length` 0). `kReadOnly`: as for load64.
template <bool kReadOnly>
__device__ __forceinline__ uint64_t quad_xxh64(const uint8_t* data, size_t length, uint64_t seed, int lane) {
  const int which = lane % 4;
  const uint64_t mine = length >= kStripe ? accumulate<kReadOnly>(data, length / kStripe, which, seed) : 0;
  uint64_t v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = __shfl_sync(0xffffffffu, mine, k, 4);
  return finish(v, data, length, seed);
}

/// Stripes of each quad's bytes a warp stages at once in quad_xxh64_staged: 512 bytes, a 16-byte load
/// per lane.
inline constexpr unsigned kStagedStripes = 16;
/// A quad's row of the staging area: its stripes and 32 bytes of padding, so that the quads' reads of
/// one stripe fall in different banks.
inline constexpr unsigned kStagedRowBytes = kStagedStripes * kStripe + 32;
/// Shared memory a warp hands quad_xxh64_staged.
inline constexpr unsigned kStagedWarpBytes = 8 * kStagedRowBytes;

/// quad_xxh64 of each quad's bytes (`data` 16-byte aligned), read by the whole warp together: each load
/// instruction reads 512 consecutive bytes of one quad's (a lane's 16), into `staging` (kStagedWarpBytes of
/// shared memory, 16-byte aligned, the warp's own), from which each lane takes its accumulator's words.
/// quad_xxh64's loads read 32 bytes in each of eight places at once; these read whole lines, and the next
/// 16 stripes' loads are in flight while the rounds of these run. Bytes are read through the read-only data
/// cache: only for bytes no thread writes while the kernel runs.
__device__ __forceinline__ uint64_t quad_xxh64_staged(const uint8_t* data, size_t length, uint64_t seed, int lane, uint8_t* staging) {
  const int which = lane % 4;
  const unsigned stripes = static_cast<unsigned>(length / kStripe);
  const uint8_t* from[8];
  unsigned count[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    from[q] = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(data), 4 * q));
    count[q] = __shfl_sync(0xffffffffu, stripes, 4 * q);
  }
  const unsigned most = __reduce_max_sync(0xffffffffu, stripes);
  // This lane's 16 bytes of quad q's stripes first .. first + 15: half lane % 2 of stripe first + lane / 2.
  uint4 loaded[8];
  const auto load = [&](unsigned first) {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if (first + lane / 2 < count[q]) loaded[q] = __ldg(reinterpret_cast<const uint4*>(from[q] + first * kStripe) + lane);
    }
  };
  const uint8_t* row = staging + (lane / 4) * kStagedRowBytes + 8 * which;
  uint64_t v = which == 0 ? seed + kPrime1 + kPrime2 : which == 1 ? seed + kPrime2 : which == 2 ? seed : seed - kPrime1;
  if (most > 0) load(0);
  for (unsigned first = 0; first < most; first += kStagedStripes) {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if (first + lane / 2 < count[q]) reinterpret_cast<uint4*>(staging + q * kStagedRowBytes)[lane] = loaded[q];
    }
    __syncwarp();
    uint64_t words[kStagedStripes];  // past this quad's stripes: whatever is there, not used
#pragma unroll
    for (unsigned k = 0; k < kStagedStripes; ++k) words[k] = *reinterpret_cast<const uint64_t*>(row + k * kStripe);
    __syncwarp();
    if (first + kStagedStripes < most) load(first + kStagedStripes);
    if (first + kStagedStripes <= stripes) {
#pragma unroll
      for (unsigned k = 0; k < kStagedStripes; ++k) v = round(v, words[k]);
    } else {
#pragma unroll
      for (unsigned k = 0; k < kStagedStripes; ++k) {
        if (first + k < stripes) v = round(v, words[k]);
      }
    }
  }
  uint64_t vs[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) vs[k] = __shfl_sync(0xffffffffu, v, k, 4);
  return finish(vs, data, length, seed);
}
#endif

}  // namespace gaac::cuda::xxh
