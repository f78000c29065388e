// Embedding layer.
#include <kiln/layers/embedding.hpp>

namespace kiln::nn {

Embedding::Embedding(int64_t num, int64_t dim, double init_std) : num_embeddings(num), embedding_dim(dim) {
  weight = register_parameter("weight", normal_init({num, dim}, init_std));
}

Tensor Embedding::forward(const Tensor& idx) const {
  auto s = scope();
  return gather_rows(weight, idx);
}

}  // namespace kiln::nn
