// Embedding: rows of a table picked by integer ids. Shape contract: idx: i32 (...) ->
// (..., dim); weight: (num, dim), initialized N(0, init_std^2). An id outside [0, num) is a
// run-time error naming it.
#pragma once

#include <kiln/layers/module.hpp>

namespace kiln::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, double init_std = 0.02);
  Tensor forward(const Tensor& idx) const;
  Tensor weight;
  int64_t num_embeddings, embedding_dim;
};

}  // namespace kiln::nn
