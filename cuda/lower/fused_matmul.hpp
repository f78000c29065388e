// The matmul kernel (fused_matmul.cpp), shared by matmul and fused_matmul. Internal to cuda/lower/.
#pragma once

#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/cuda/lower/lower.hpp>

namespace kiln::cuda {

// Lowers op (of c) as the program `f` describes (batch dims that the rows continue through folded
// into the rows); kernels are named `prefix` and a hash.
LoweredOp lower_matmul_program(const Circuit& c, const Op& op, const FusedMatmul& f, const char* prefix,
                               const Target& target);

}  // namespace kiln::cuda
