// OneDnnMatmul: one matmul Prim's product on oneDNN's matmul primitive, made once per plan op
// (EvalBuffers::compiled) and run by every replay of the step without making anything: the
// primitive, its memory descriptors and its scratchpad are the op's; a run only points them at
// its operands. With bf16 operands oneDNN picks AMX tiles or AVX512-BF16 kernels (f32
// accumulation, an f32 product); f32 operands take the same code (the tests check the layout
// handling with them on CPUs without bf16 kernels).
//
// Shape contract: a (batch_a..., ra, ca) and b (batch_b..., rb, cb), row-major and contiguous;
// op(a) = a, or aᵀ with ta ((..., M, K) from (..., K, M)), op(b) likewise; batch dims broadcast
// (numpy: missing leading dims and dims of 1) to c's (batch..., M, N), f32, contiguous.
#pragma once

#include <memory>

#include <kiln/circuit/ir/types.hpp>

namespace kiln {

class OneDnnMatmul {
 public:
  // Throws kiln::Error (naming op 'matmul' and the shapes) where oneDNN has no such product on
  // this CPU (bf16 needs AVX-512; Debian's oneDNN 2.6 has none on AVX2 machines) or kiln was
  // built without oneDNN.
  OneDnnMatmul(DType operands, const Shape& a, bool ta, const Shape& b, bool tb, const Shape& c);
  OneDnnMatmul(OneDnnMatmul&&) noexcept;
  OneDnnMatmul& operator=(OneDnnMatmul&&) noexcept;
  ~OneDnnMatmul();

  // c = op(a) op(b). a and b hold the operands' dtype (Bf16 or float), c floats.
  void run(const void* a, const void* b, float* c) const;
  // oneDNN's name for the kernel it chose ("brg:avx512_core_amx", "gemm:jit", ...).
  std::string kernel() const;

  // True where this build and CPU have oneDNN matmuls of `operands` (f32 or bf16).
  static bool available(DType operands);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
