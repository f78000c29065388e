// The key/value cache and one step of cached attention.
#include <cmath>
#include <limits>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/scalar_exp.hpp>
#include <kiln/layers/kv_cache.hpp>

namespace kiln::nn {

KVCache::KVCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t max_len, int64_t head_dim, DType dtype)
    : max_len_(max_len) {
  for (int64_t i = 0; i < layers; ++i)
    layers_.push_back({Tensor::state("kv_cache.k", {batch, kv_heads, max_len, head_dim}, dtype),
                       Tensor::state("kv_cache.v", {batch, kv_heads, max_len, head_dim}, dtype)});
}

Tensor repeat_kv_heads(const Tensor& y, int64_t heads) {
  const Shape& s = y.shape();
  const int64_t b = s[0], hkv = s[1], len = s[2], hs = s[3];
  if (hkv == heads) return y;
  return reshape(broadcast_to(reshape(y, {b, hkv, 1, len, hs}), {b, hkv, heads / hkv, len, hs}), {b, heads, len, hs});
}

Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& position,
                        KVCache::Layer& cache) {
  const Shape& cs = cache.k.shape();  // (B, Hkv, L, hs)
  const int64_t b = cs[0], hkv = cs[1], len = cs[2], hs = cs[3], h = q.shape()[1];
  if (k.shape() != Shape{b, hkv, 1, hs} || v.shape() != k.shape() || q.shape() != Shape{b, h, 1, hs} || h % hkv != 0)
    throw Error("cached_attention: expected q (" + std::to_string(b) + ", H, 1, " + std::to_string(hs) + ") and k, v " +
                Shape{b, hkv, 1, hs}.str() + " for a cache " + cs.str() + ", received q " + q.shape().str() + ", k " +
                k.shape().str() + ", v " + v.shape().str());
  // Slot t of the cache takes this token's k, v where t == position.
  const Tensor slots = reshape(cast(arange(len), q.dtype()), {1, 1, len, 1});
  const ScalarExp write = se::select(se::eq(se::in(0), se::in(1)), se::in(2), se::in(3));
  const Tensor keys = map(write, {slots, position, k, cache.k}), values = map(write, {slots, position, v, cache.v});
  cache.k.assign(keys);
  cache.v.assign(values);
  Tensor scores =
      matmul(q * (1.0 / std::sqrt(static_cast<double>(hs))), repeat_kv_heads(keys, h), false, true);  // (B, H, 1, L)
  // Positions after this one hold nothing yet.
  const ScalarExp mask_later =
      se::select(se::gt(se::in(0), se::in(1)), se::c(-std::numeric_limits<double>::infinity()), se::in(2));
  scores = map(mask_later, {reshape(slots, {1, 1, 1, len}), position, scores});
  return matmul(softmax(scores), repeat_kv_heads(values, h));  // (B, H, 1, hs)
}

}  // namespace kiln::nn
