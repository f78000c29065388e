// The matmul kernel (fused_matmul.cpp), shared by matmul and fused_matmul. Internal to cuda/lower/.
#pragma once

#include "circuit/prims/fused_matmul.hpp"
#include "cuda/lower/lower.hpp"

namespace kiln::cuda {

// Lowers op (of c) as the program `f` describes; kernels are named `prefix` and a hash.
LoweredOp lower_matmul_program(const Circuit& c, const Op& op, const FusedMatmul& f, const char* prefix);

// Tests: every matmul kernel takes tiles of `size` (64 or 128) for the guard's lifetime,
// whatever its shape, so that both tilings run on small matrices in the simulator and ptxas.
class ForceMatmulTile {
 public:
  explicit ForceMatmulTile(int size);
  ~ForceMatmulTile();
  ForceMatmulTile(const ForceMatmulTile&) = delete;
  ForceMatmulTile& operator=(const ForceMatmulTile&) = delete;

 private:
  int saved_;
};

}  // namespace kiln::cuda
