#include <cmath>
#include <numbers>

#include "gaac/bf16.hpp"
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

}  // namespace

KvDump make_synthetic_kv(const SyntheticKvSpec& spec) {
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
