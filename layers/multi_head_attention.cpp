// Multi-head attention with grouped-query heads and rotary embeddings.
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/layers/multi_head_attention.hpp>

namespace kiln::nn {

MultiHeadAttention::MultiHeadAttention(const AttentionOptions& options) : o_(options) {
  if (o_.n_kv_heads == 0) o_.n_kv_heads = o_.n_heads;
  auto fail = [&](const std::string& why) {
    throw Error("MultiHeadAttention(dim " + std::to_string(o_.dim) + ", " + std::to_string(o_.n_heads) + " heads, " +
                std::to_string(o_.n_kv_heads) + " key/value heads): " + why);
  };
  if (o_.dim < 1 || o_.n_heads < 1 || o_.n_kv_heads < 1) fail("sizes must be positive");
  if (o_.dim % o_.n_heads != 0) fail("dim is not divisible by the number of heads");
  if (o_.n_heads % o_.n_kv_heads != 0) fail("the number of heads is not divisible by the key/value heads");
  const int64_t kv_dim = o_.n_kv_heads * head_dim();
  if (o_.fused_qkv) {
    qkv_proj = register_module("qkv_proj", std::make_shared<Linear>(o_.dim, o_.dim + 2 * kv_dim, o_.bias, o_.init_std));
  } else {
    q_proj = register_module("q_proj", std::make_shared<Linear>(o_.dim, o_.dim, o_.bias, o_.init_std));
    k_proj = register_module("k_proj", std::make_shared<Linear>(o_.dim, kv_dim, o_.bias, o_.init_std));
    v_proj = register_module("v_proj", std::make_shared<Linear>(o_.dim, kv_dim, o_.bias, o_.init_std));
  }
  o_proj = register_module("o_proj", std::make_shared<Linear>(o_.dim, o_.dim, o_.bias, o_.out_init_std));
  if (o_.rope_theta > 0) rope_.emplace(head_dim(), o_.rope_theta, o_.rope_scaling);
}

std::array<Tensor, 3> MultiHeadAttention::project(const Tensor& x) const {
  if (x.rank() != 3 || x.shape()[2] != o_.dim)
    throw Error("MultiHeadAttention in layer '" + Engine::current().scope() + "': expected x (B, T, " +
                std::to_string(o_.dim) + "), received " + x.shape().str());
  const int64_t b = x.shape()[0], t = x.shape()[1], hs = head_dim(), h = o_.n_heads, hkv = o_.n_kv_heads;
  Tensor q, k, v;  // (B, T, heads * hs)
  if (qkv_proj) {
    std::vector<Tensor> qkv = split(qkv_proj->forward(x), 2, {h * hs, hkv * hs, hkv * hs});
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = q_proj->forward(x), k = k_proj->forward(x), v = v_proj->forward(x);
  }
  auto heads = [&](const Tensor& y, int64_t n) {  // (B, T, n * hs) -> (B, n, T, hs)
    return permute(reshape(y, {b, t, n, hs}), {0, 2, 1, 3});
  };
  return {heads(q, h), heads(k, hkv), heads(v, hkv)};
}

Tensor MultiHeadAttention::merge_heads(const Tensor& y) const {  // (B, H, T, hs) -> (B, T, dim)
  const int64_t b = y.shape()[0], t = y.shape()[2];
  return o_proj->forward(reshape(permute(y, {0, 2, 1, 3}), {b, t, o_.dim}));
}

Tensor MultiHeadAttention::decode(const Tensor& x, const Tensor& position, KVCache::Layer& cache) const {
  auto s = scope();
  if (!o_.causal) throw Error("MultiHeadAttention.decode: a key/value cache serves causal attention only");
  if (x.rank() != 3 || x.shape()[1] != 1)
    throw Error("MultiHeadAttention.decode: expected one token x (B, 1, " + std::to_string(o_.dim) + "), received " +
                x.shape().str());
  auto [q, k, v] = project(x);
  if (rope_) {
    auto [cos, sin] = rope_->tables_at(position);
    q = rope_->apply(q, cos, sin), k = rope_->apply(k, cos, sin);
  }
  return merge_heads(cached_attention(q, k, v, position, cache));
}

Tensor MultiHeadAttention::forward(const Tensor& x) const { return attend(x, nullptr); }

Tensor MultiHeadAttention::forward(const Tensor& x, const Tensor& mask) const {
  if (x.rank() == 3) {
    const Shape scores{x.shape()[0], o_.n_heads, x.shape()[1], x.shape()[1]};
    bool broadcasts = mask.rank() <= 4;
    for (int d = 1; broadcasts && d <= mask.rank(); ++d)
      broadcasts = mask.shape()[mask.rank() - d] == 1 || mask.shape()[mask.rank() - d] == scores[4 - d];
    if (!broadcasts || mask.dtype() != x.dtype())
      throw Error("MultiHeadAttention.forward: the additive mask must be " + std::string(dtype_name(x.dtype())) +
                  " and broadcast to the scores' shape " + scores.str() + ", received " + dtype_name(mask.dtype()) +
                  " " + mask.shape().str());
  }
  return attend(x, &mask);
}

Tensor MultiHeadAttention::attend(const Tensor& x, const Tensor* mask) const {
  auto s = scope();
  auto [q, k, v] = project(x);
  if (rope_) {
    auto [cos, sin] = rope_->tables(0, x.shape()[1], x.dtype());
    q = rope_->apply(q, cos, sin), k = rope_->apply(k, cos, sin);
  }
  k = repeat_kv_heads(k, o_.n_heads), v = repeat_kv_heads(v, o_.n_heads);
  Tensor att = matmul(q * (1.0 / std::sqrt(static_cast<double>(head_dim()))), k, false, true);  // (B, H, T, T)
  if (mask) att = att + *mask;
  if (o_.causal) att = causal_mask_fill(att);
  return merge_heads(matmul(softmax(att), v));  // (B, H, T, hs) -> (B, T, dim)
}

}  // namespace kiln::nn
