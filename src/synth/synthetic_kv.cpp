#include <cmath>
#include <numbers>

#include <unistd.h>

#include <cstdint>
#include <string>

#include "gaac/bf16.hpp"
#include "gaac/error.hpp"
#include "gaac/synthetic.hpp"

namespace gaac {
namespace {

/// splitmix64: small, fast, and identical everywhere.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in (0, 1).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  /// Standard normal (Box-Muller).
  double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * std::numbers::pi * uniform()); }

 private:
  uint64_t state_;
};

KvTensor make_tensor(const SyntheticKvSpec& spec, Random& random, double log2_scale_mean) {
  KvTensor t{spec.tokens, spec.kv_heads, spec.head_dim, {}};
  t.data.resize(t.elements());
  const int width = spec.kv_heads * spec.head_dim;
  std::vector<double> sigma(static_cast<size_t>(width));
  for (double& s : sigma) s = std::exp2(log2_scale_mean + 1.25 * random.normal());
  for (int token = 0; token < spec.tokens; ++token) {
    for (int i = 0; i < width; ++i) {
      double x = sigma[static_cast<size_t>(i)] * random.normal();
      if (random.uniform() < 1e-3) x *= std::exp2(4.0 + 4.0 * random.uniform());  // rare outlier
      t.data[static_cast<size_t>(token) * width + i] = float_to_bf16(static_cast<float>(x));
    }
  }
  return t;
}



/// Throws gaac::Error unless `spec` describes a dump gaac can hold in this machine's memory.
void check_spec(const SyntheticKvSpec& spec) {
  if (spec.layers < 1 || spec.kv_heads < 1 || spec.tokens < 0) {
    throw Error("synthetic KV needs layers >= 1, kv_heads >= 1 and tokens >= 0, got " + std::to_string(spec.layers) + ", " +
                std::to_string(spec.kv_heads) + " and " + std::to_string(spec.tokens));
  }
  if (spec.head_dim != 64 && spec.head_dim != 128 && spec.head_dim != 256) {
    throw Error("synthetic KV head_dim is " + std::to_string(spec.head_dim) + "; gaac supports 64, 128 or 256");
  }
  uint64_t bytes = 0;  // 2 tensors per layer, 2 bytes per element
  if (__builtin_mul_overflow(uint64_t{4} * static_cast<uint64_t>(spec.layers) * static_cast<uint64_t>(spec.head_dim),
                             static_cast<uint64_t>(spec.tokens) * static_cast<uint64_t>(spec.kv_heads), &bytes)) {
    bytes = UINT64_MAX;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0 && bytes / static_cast<uint64_t>(page) >= static_cast<uint64_t>(pages)) {
    throw Error("synthetic KV of " + std::to_string(spec.layers) + " layers × " + std::to_string(spec.tokens) + " tokens × " +
                std::to_string(spec.kv_heads) + " KV heads × head_dim " + std::to_string(spec.head_dim) +
                " is more than this machine's memory");
  }
}

}  // namespace

KvDump make_synthetic_kv(const SyntheticKvSpec& spec) {
  check_spec(spec);
  Random random(spec.seed);
  KvDump dump;
  for (int layer = 0; layer < spec.layers; ++layer) {
    KvLayer l;
    l.k = make_tensor(spec, random, 0.0);
    l.v = make_tensor(spec, random, -2.0);
    dump.layers.push_back(std::move(l));
  }
  dump.metadata.emplace_back("source", "gaac synthetic seed=" + std::to_string(spec.seed));
  return dump;
}

}  // namespace gaac
