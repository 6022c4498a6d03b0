// XXH64 (seed 0 or any) for one thread: the KV chunk objects' checksums computed on the device, one
// thread per 4 KiB piece (docs/format.md, section 15). Written from the algorithm's specification;
// plain integer code that compiles for the host too, where a test checks it against libxxhash on every
// length. Reads `data` with 8-byte loads from its start: the pointer must be 8-byte aligned.
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

GAAC_XXH_INLINE uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

GAAC_XXH_INLINE uint64_t round(uint64_t acc, uint64_t input) { return rotl(acc + input * kPrime2, 31) * kPrime1; }

GAAC_XXH_INLINE uint64_t merge(uint64_t acc, uint64_t value) { return (acc ^ round(0, value)) * kPrime1 + kPrime4; }

/// Little-endian words at an aligned address (the device and x86 are little-endian).
GAAC_XXH_INLINE uint64_t load64(const uint8_t* p) { return *reinterpret_cast<const uint64_t*>(p); }
GAAC_XXH_INLINE uint32_t load32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

/// XXH64 of `length` bytes at `data` (8-byte aligned) with `seed`.
GAAC_XXH_INLINE uint64_t xxh64(const uint8_t* data, size_t length, uint64_t seed) {
  const uint8_t* p = data;
  const uint8_t* end = data + length;
  uint64_t h;
  if (length >= 32) {
    uint64_t v1 = seed + kPrime1 + kPrime2, v2 = seed + kPrime2, v3 = seed, v4 = seed - kPrime1;
    for (; p + 32 <= end; p += 32) {
      v1 = round(v1, load64(p));
      v2 = round(v2, load64(p + 8));
      v3 = round(v3, load64(p + 16));
      v4 = round(v4, load64(p + 24));
    }
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(h, v1);
    h = merge(h, v2);
    h = merge(h, v3);
    h = merge(h, v4);
  } else {
    h = seed + kPrime5;
  }
  h += static_cast<uint64_t>(length);
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

}  // namespace gaac::cuda::xxh
