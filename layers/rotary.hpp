// Rotary position embeddings in the rotate-half form of GPT-NeoX and Hugging Face's Llama:
// for a head vector x of even size d at position p, with x1 = x[:d/2], x2 = x[d/2:],
//   rope(x) = x * cos(p f) + concat(-x2, x1) * sin(p f),  f_i = theta^(-2 (i mod d/2) / d).
// The cos/sin tables are computed inside the step from iota (values that depend on no input,
// so the executor computes them once per plan, not per step: no host work, no upload).
// Shape contract: x (..., T, d) -> (..., T, d); positions start, start + 1, ..., start + T - 1.
#pragma once

#include <utility>
#include <vector>

#include <kiln/core/tensor.hpp>

namespace kiln::nn {

// Llama 3.1's rewrite of the frequencies for longer contexts (transformers' rope type "llama3"):
// with wavelength w = 2 pi / f, frequencies with w < original_max_position / high_freq_factor
// are kept, those with w > original_max_position / low_freq_factor divided by `factor`, and
// those between interpolated: s = (original_max_position / w - low) / (high - low),
// f' = (1 - s) f / factor + s f. factor = 0: no rewrite.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position = 8192;
  bool enabled() const { return factor > 0; }
};

// The frequencies f_i, i < head_dim / 2, in f64 (with the scaling's rewrite, if any).
std::vector<double> rope_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling = {});

class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(int64_t head_dim, double theta = 10000.0, const RopeScaling& scaling = {});
  // (cos, sin), each (T, head_dim), for positions start .. start + T - 1.
  std::pair<Tensor, Tensor> tables(int64_t start, int64_t t, DType dtype) const;
  // (cos, sin), each (1, head_dim), for the one position a runtime scalar gives (decoding).
  std::pair<Tensor, Tensor> tables_at(const Tensor& position) const;
  // Rotates x (..., T, head_dim) by the tables of its positions.
  Tensor apply(const Tensor& x, const Tensor& cos, const Tensor& sin) const;
  Tensor forward(const Tensor& x, int64_t start = 0) const;
  int64_t head_dim;
  double theta;
  RopeScaling scaling;

 private:
  Tensor frequencies(DType dtype) const;  // (1, head_dim): f_i for i < d/2, repeated
};

}  // namespace kiln::nn
