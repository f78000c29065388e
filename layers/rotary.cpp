// Rotary position embeddings.
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/layers/rotary.hpp>

namespace kiln::nn {

std::vector<double> rope_frequencies(int64_t head_dim, double theta, const RopeScaling& s) {
  std::vector<double> f(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < f.size(); ++i)
    f[i] = std::exp(static_cast<double>(i) * (-2.0 * std::log(theta) / static_cast<double>(head_dim)));
  if (!s.enabled()) return f;
  const double old_context = static_cast<double>(s.original_max_position);
  const double low_wavelen = old_context / s.low_freq_factor, high_wavelen = old_context / s.high_freq_factor;
  for (double& fi : f) {
    const double wavelen = 2 * M_PI / fi;
    if (wavelen < high_wavelen) continue;  // high frequencies: kept
    if (wavelen > low_wavelen) {           // low frequencies: divided
      fi /= s.factor;
      continue;
    }
    const double smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    fi = (1 - smooth) * fi / s.factor + smooth * fi;
  }
  return f;
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta, const RopeScaling& scaling)
    : head_dim(head_dim), theta(theta), scaling(scaling) {
  if (head_dim < 2 || head_dim % 2 != 0)
    throw Error("RotaryEmbedding: the head size must be even and at least 2, received " + std::to_string(head_dim));
  if (!(theta > 1)) throw Error("RotaryEmbedding: theta must be > 1, received " + std::to_string(theta));
  if (scaling.enabled() && !(scaling.factor >= 1 && scaling.high_freq_factor > scaling.low_freq_factor &&
                             scaling.low_freq_factor > 0 && scaling.original_max_position > 0))
    throw Error("RotaryEmbedding: llama3 rope scaling needs factor >= 1 and high_freq_factor > low_freq_factor > 0, "
                "received factor " + std::to_string(scaling.factor) + ", low " +
                std::to_string(scaling.low_freq_factor) + ", high " + std::to_string(scaling.high_freq_factor));
}

Tensor RotaryEmbedding::frequencies(DType dtype) const {
  if (scaling.enabled()) {  // a rewrite iota cannot express: the table from the host, a constant
    std::vector<double> f = rope_frequencies(head_dim, theta, scaling);
    f.insert(f.end(), f.begin(), f.end());
    return Tensor::from_vector(f, {1, head_dim}, dtype);
  }
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
