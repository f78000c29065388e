// Multi-head attention in the layout of Hugging Face's Llama and its kin: separate q/k/v/o
// projections (or one fused qkv_proj), optional biases, grouped-query attention (n_kv_heads
// dividing n_heads: query head h reads key/value head h / (n_heads / n_kv_heads), as
// transformers' repeat_kv), optional rotary embeddings on q and k, optional causal mask.
// Shape contract: x (B, T, dim) -> (B, T, dim); head size dim / n_heads; q: n_heads heads,
// k and v: n_kv_heads heads; scores scaled by 1 / sqrt(head size).
#pragma once

#include <array>
#include <optional>

#include <kiln/layers/kv_cache.hpp>
#include <kiln/layers/linear.hpp>
#include <kiln/layers/rotary.hpp>

namespace kiln::nn {

struct AttentionOptions {
  int64_t dim = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: n_heads (plain multi-head attention)
  bool bias = false;       // biases on the q/k/v and output projections
  bool fused_qkv = false;  // one projection "qkv_proj" giving q, k, v in that order
  bool causal = true;      // position t attends to positions <= t only
  double rope_theta = 0;   // > 0: rotary embeddings on q and k with this base
  RopeScaling rope_scaling;  // of their frequencies (none by default)
  double init_std = 0.02;  // of the input projections
  double out_init_std = 0.02;
};

class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const AttentionOptions& options);
  Tensor forward(const Tensor& x) const;
  // With an additive mask on the scores (before the causal mask, if any), of x's dtype and
  // broadcast to (B, n_heads, T, T): e.g. (B, 1, 1, T) with -inf at padded keys, or a (T, T) bias.
  // It gets no gradient through the fused attention (a mask that needs one keeps the chain
  // unfused).
  Tensor forward(const Tensor& x, const Tensor& mask) const;
  // One token x (B, 1, dim) at `position` (a runtime scalar of x's dtype) with the layer's cache
  // (causal attention only): its keys and values join the cache. Returns (B, 1, dim).
  Tensor decode(const Tensor& x, const Tensor& position, KVCache::Layer& cache) const;
  const AttentionOptions& options() const { return o_; }
  int64_t head_dim() const { return o_.dim / o_.n_heads; }
  // Separate projections, or qkv_proj when fused (the others are then null).
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, qkv_proj, o_proj;

 private:
  std::array<Tensor, 3> project(const Tensor& x) const;  // q (B, H, T, hs), k and v (B, Hkv, T, hs)
  Tensor merge_heads(const Tensor& y) const;             // (B, H, T, hs) -> o_proj -> (B, T, dim)
  Tensor attend(const Tensor& x, const Tensor* mask) const;
  AttentionOptions o_;
  std::optional<RotaryEmbedding> rope_;
};

}  // namespace kiln::nn
