// The key/value cache of incremental decoding: for each attention layer, the keys and values of
// every position decoded so far, so that one new token costs one token's forward (its q, k, v
// and an attention over the cache), not a pass over the whole context.
// Shape contract: per layer K and V (B, kv_heads, max_len, head_dim), persistent tensors of the
// engine; entries past the current position are never read (masked), so the cache starts as zeros.
#pragma once

#include <vector>

#include <kiln/core/tensor.hpp>

namespace kiln::nn {

class KVCache {
 public:
  struct Layer {
    Tensor k, v;
  };
  KVCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t max_len, int64_t head_dim, DType dtype = DType::f32);
  Layer& layer(size_t i) { return layers_.at(i); }
  int64_t max_len() const { return max_len_; }
  DType dtype() const { return layers_.front().k.dtype(); }

 private:
  std::vector<Layer> layers_;
  int64_t max_len_;
};

// Grouped-query attention's key/value heads for the query heads: y (B, kv_heads, L, hs) ->
// (B, heads, L, hs), each key/value head serving heads / kv_heads consecutive query heads (as
// transformers' repeat_kv); y itself when heads == kv_heads.
Tensor repeat_kv_heads(const Tensor& y, int64_t heads);

// One decoding step of attention: writes k and v (B, kv_heads, 1, hs) of the token at `position`
// (a runtime scalar of the queries' dtype, so every step runs one compiled plan) into the cache,
// then attends q (B, heads, 1, hs), scaled by 1 / sqrt(hs), over positions 0..position. Each
// key/value head serves heads / kv_heads consecutive query heads. Returns (B, heads, 1, hs).
Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& position,
                        KVCache::Layer& cache);

}  // namespace kiln::nn
