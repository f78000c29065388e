// Rotary position embeddings.
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/layers/rotary.hpp>

namespace kiln::nn {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta) : head_dim(head_dim), theta(theta) {
  if (head_dim < 2 || head_dim % 2 != 0)
    throw Error("RotaryEmbedding: the head size must be even and at least 2, received " + std::to_string(head_dim));
  if (!(theta > 1)) throw Error("RotaryEmbedding: theta must be > 1, received " + std::to_string(theta));
}

Tensor RotaryEmbedding::frequencies(DType dtype) const {
  Tensor f = exp(cast(arange(head_dim / 2), dtype) * (-2.0 * std::log(theta) / static_cast<double>(head_dim)));
  return reshape(concat({f, f}, 0), {1, head_dim});
}

std::pair<Tensor, Tensor> RotaryEmbedding::tables(int64_t start, int64_t t, DType dtype) const {
  Tensor pos = reshape(cast(arange(t), dtype) + static_cast<double>(start), {t, 1});  // (T, 1)
  Tensor angle = pos * frequencies(dtype);                                            // (T, d)
  return {cos(angle), sin(angle)};
}

std::pair<Tensor, Tensor> RotaryEmbedding::tables_at(const Tensor& position) const {
  Tensor angle = frequencies(position.dtype()) * position;  // (1, d)
  return {cos(angle), sin(angle)};
}

Tensor RotaryEmbedding::apply(const Tensor& x, const Tensor& cos, const Tensor& sin) const {
  if (x.rank() < 2 || x.shape()[x.rank() - 1] != head_dim)
    throw Error("RotaryEmbedding(" + std::to_string(head_dim) + ") in layer '" + Engine::current().scope() +
                "': expected x (..., T, " + std::to_string(head_dim) + "), received " + x.shape().str());
  const int last = static_cast<int>(x.rank()) - 1;
  const int64_t half = head_dim / 2;
  Tensor rotated = concat({-slice(x, last, half, head_dim), slice(x, last, 0, half)}, last);
  return x * cos + rotated * sin;
}

Tensor RotaryEmbedding::forward(const Tensor& x, int64_t start) const {
  if (x.rank() < 2) throw Error("RotaryEmbedding: expected x (..., T, d), received " + x.shape().str());
  auto [c, s] = tables(start, x.shape()[x.rank() - 2], x.dtype());
  return apply(x, c, s);
}

}  // namespace kiln::nn
