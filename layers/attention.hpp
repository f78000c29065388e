// Causal multi-head self-attention with a fused QKV projection (GPT-2 / nanoGPT layout).
// Shape contract: x: (B, T, C) -> (B, T, C); c_attn: Linear(C, 3C) giving q, k, v in that
// order along the last axis; heads of size C / n_head; scores scaled by 1 / sqrt(head size),
// future positions masked before the softmax; c_proj: Linear(C, C).
#pragma once

#include <kiln/layers/dropout.hpp>
#include <kiln/layers/kv_cache.hpp>
#include <kiln/layers/linear.hpp>

namespace kiln::nn {

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, double dropout = 0.0, double proj_init_std = 0.02);
  Tensor forward(const Tensor& x) const;
  // One token x (B, 1, C) at `position` (a runtime scalar of x's dtype) with the layer's cache;
  // its keys and values join the cache (dropout off). Returns (B, 1, C).
  Tensor decode(const Tensor& x, const Tensor& position, KVCache::Layer& cache) const;
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;
  int64_t n_embd, n_head;
};

}  // namespace kiln::nn
