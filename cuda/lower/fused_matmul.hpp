// The matmul kernel (fused_matmul.cpp), shared by matmul and fused_matmul. Internal to cuda/lower/.
#pragma once

#include <optional>

#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/cuda/lower/lower.hpp>

namespace kiln::cuda {

// Lowers op (of c) as the program `f` describes (batch dims that the rows continue through folded
// into the rows); kernels are named `prefix` and a hash.
LoweredOp lower_matmul_program(const Circuit& c, const Op& op, const FusedMatmul& f, const char* prefix);

// Tests: every matmul kernel takes tiles of `size` (64 or 128) for the guard's lifetime,
// whatever its shape, so that both tilings run on small matrices in the simulator and ptxas.
// Tests: matmul kernels of 128x128 tiles use tf32 tensor cores (as KILN_ALLOW_TF32=1) for the
// guard's lifetime.
class ForceTf32Matmuls {
 public:
  ForceTf32Matmuls();
  ~ForceTf32Matmuls();
  ForceTf32Matmuls(const ForceTf32Matmuls&) = delete;
  ForceTf32Matmuls& operator=(const ForceTf32Matmuls&) = delete;

 private:
  bool saved_;
};

// Tests: KILN_BF16_MMA=on for the guard's lifetime, whatever the environment says. On (the
// default): the matmul fusion keeps casts to bf16 as ops, and matmuls whose operands qualify
// (both stored bf16, k or rows contiguous, 16-byte chunks) run on the bf16 mma.sync kernel. Off:
// casts fold into the matmuls as roundings, and bf16 values are widened in f32 tiles.
class ForceBf16Mma {
 public:
  explicit ForceBf16Mma(bool on = true);
  ~ForceBf16Mma();
  ForceBf16Mma(const ForceBf16Mma&) = delete;
  ForceBf16Mma& operator=(const ForceBf16Mma&) = delete;

 private:
  std::optional<bool> saved_option_;
};

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
