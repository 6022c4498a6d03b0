// The device's XXH64 (src/cuda/xxh64.cuh) run on the host against libxxhash: every length from 0 to 1,100
// (short inputs, the tail, one and two batches of stripes and what is left after them) and the 4 KiB
// pieces of KV chunk objects, with seeds, on random bytes; and the hash from its four accumulators
// computed apart, as the four lanes of a quad compute them. Needs no GPU.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "cuda/xxh64.cuh"

namespace gaac {
namespace {

TEST(DeviceXxh64, EqualsLibxxhashOnEveryLength) {
  std::mt19937_64 rng(5);
  std::vector<uint64_t> words(1024);  // 8-byte aligned storage, as on the device
  for (uint64_t& w : words) w = rng();
  const auto* bytes = reinterpret_cast<const uint8_t*>(words.data());
  for (size_t length = 0; length <= 1100; ++length) {
    for (const uint64_t seed : {uint64_t{0}, uint64_t{1}, rng()}) {
      ASSERT_EQ(cuda::xxh::xxh64(bytes, length, seed), XXH64(bytes, length, seed)) << "length " << length;
    }
  }
  for (const size_t length : {size_t{4096}, size_t{4095}, size_t{8192}, size_t{4100}}) {
    ASSERT_EQ(cuda::xxh::xxh64(bytes, length, 0), XXH64(bytes, length, 0)) << "length " << length;
  }
}

TEST(DeviceXxh64, FromFourAccumulatorsComputedApart) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> words(1024);
  for (uint64_t& w : words) w = rng();
  const auto* bytes = reinterpret_cast<const uint8_t*>(words.data());
  for (const size_t length : {size_t{0}, size_t{31}, size_t{32}, size_t{160}, size_t{511}, size_t{2144}, size_t{4096}, size_t{8000}}) {
    uint64_t v[4] = {};
    for (int which = 0; which < 4; ++which) v[which] = cuda::xxh::accumulate(bytes, length / 32, which, 0);
    ASSERT_EQ(cuda::xxh::finish(v, bytes, length, 0), XXH64(bytes, length, 0)) << "length " << length;
  }
}

}  // namespace
}  // namespace gaac
