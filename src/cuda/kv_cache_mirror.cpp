// A host KvCache copied to the GPU with some of its sequences: decode attention and decompression there.
#include <algorithm>
#include <string>

#include "gaac/cuda.hpp"

namespace gaac::cuda {

KvCacheMirror::KvCacheMirror(const KvCache& host, std::span<const SequenceId> sequences)
    : memory_(CacheMemory::upload(host)), batch_(BatchTable::upload(host.sequence_table(sequences).view())) {}

void KvCacheMirror::plan_for(int q_heads, int blocks_per_split) {
  if (plan_.planned() && plan_.config().q_heads == q_heads && plan_.config().blocks_per_split == blocks_per_split) return;
  DecodeConfig config;
  config.q_heads = q_heads;
  config.blocks_per_split = blocks_per_split;
  plan_.plan(memory_, batch_, config);
}

void KvCacheMirror::attend(int layer, const uint16_t* q, uint16_t* out, int q_heads, float scale, int blocks_per_split,
                           Stream stream) {
  plan_for(q_heads, blocks_per_split);
  plan_.run(memory_, batch_, layer, q, out, scale, stream);
}

int KvCacheMirror::planned_blocks_per_split(int layer, int q_heads) {
  plan_for(q_heads, 0);
  return plan_.split(layer).blocks_per_split;
}

int KvCacheMirror::longest() const {
  int longest = 0;
  for (int s = 0; s < batch_.sequences(); ++s) longest = std::max(longest, batch_.length(s));
  return longest;
}

void KvCacheMirror::decompress(uint16_t* k, uint16_t* v, Stream stream) const {
  const PagedGeometry& geo = memory_.geometry();
  DenseLayout out;
  out.k = k;
  out.v = v;
  out.head_stride = geo.head_dim;
  out.token_stride = static_cast<int64_t>(geo.kv_heads) * geo.head_dim;
  out.outer_stride = out.token_stride * longest();
  out.layer_stride = out.outer_stride * sequences();
  decompress_dense(memory_, batch_, 0, geo.layers, out, stream);
}

}  // namespace gaac::cuda
