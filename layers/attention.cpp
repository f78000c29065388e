// Causal self-attention.
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/layers/attention.hpp>

namespace kiln::nn {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, double dropout, double proj_init_std)
    : n_embd(n_embd), n_head(n_head) {
  if (n_head <= 0 || n_embd % n_head != 0)
    throw Error("CausalSelfAttention: n_embd " + std::to_string(n_embd) + " is not divisible by n_head " +
                std::to_string(n_head));
  c_attn = register_module("c_attn", std::make_shared<Linear>(n_embd, 3 * n_embd));
  c_proj = register_module("c_proj", std::make_shared<Linear>(n_embd, n_embd, true, proj_init_std));
  attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>(dropout));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(dropout));
}

Tensor CausalSelfAttention::decode(const Tensor& x, const Tensor& position, KVCache::Layer& cache) const {
  auto s = scope();
  if (x.rank() != 3 || x.shape()[1] != 1 || x.shape()[2] != n_embd)
    throw Error("CausalSelfAttention.decode: expected one token x (B, 1, " + std::to_string(n_embd) + "), received " +
                x.shape().str());
  const int64_t b = x.shape()[0], hs = n_embd / n_head;
  std::vector<Tensor> qkv = split(c_attn->forward(x), 2, {n_embd, n_embd, n_embd});           // 3 x (B, 1, C)
  auto heads = [&](const Tensor& y) { return reshape(y, {b, n_head, 1, hs}); };               // T = 1: no permute
  Tensor y = cached_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), position, cache);  // (B, H, 1, hs)
  return c_proj->forward(reshape(y, {b, 1, n_embd}));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  auto s = scope();
  if (x.rank() != 3 || x.shape()[2] != n_embd)
    throw Error("CausalSelfAttention in layer '" + Engine::current().scope() + "': expected x (B, T, " +
                std::to_string(n_embd) + "), received " + x.shape().str());
  const int64_t b = x.shape()[0], t = x.shape()[1], hs = n_embd / n_head;
  std::vector<Tensor> qkv = split(c_attn->forward(x), 2, {n_embd, n_embd, n_embd});                     // 3 x (B, T, C)
  auto heads = [&](const Tensor& y) { return permute(reshape(y, {b, t, n_head, hs}), {0, 2, 1, 3}); };  // (B, H, T, hs)
  // The scale goes on q, half the size of the scores.
  Tensor q = heads(qkv[0]) * (1.0 / std::sqrt(static_cast<double>(hs))), k = heads(qkv[1]), v = heads(qkv[2]);
  Tensor att = matmul(q, k, false, true);  // (B, H, T, T)
  att = attn_dropout->forward(softmax(causal_mask_fill(att)));
  Tensor y = matmul(att, v);                              // (B, H, T, hs)
  y = reshape(permute(y, {0, 2, 1, 3}), {b, t, n_embd});  // (B, T, C)
  return resid_dropout->forward(c_proj->forward(y));
}

}  // namespace kiln::nn
