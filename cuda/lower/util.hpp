// Code-generation helpers shared by the lowerings in cuda/lower_*.cpp: index arithmetic in the
// kernel's index type, grid-stride loops, coordinates of a flat index, value expressions
// (ScalarExp) and index expressions (IndexExp) in kernel IR, and Philox4x32-10.
#pragma once

#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/lower/lower.hpp>

namespace kiln::cuda {

using kir::KernelBuilder;
using kir::Operand;
using kir::Reg;
using kir::Type;

// Element indices are u32 when every buffer a kernel touches has fewer than 2^31 elements,
// else u64 (the design's rule: 64-bit index arithmetic where buffers can exceed 2^31 bytes).
// Target::wide_indices makes them u64 always (tests: the s64/u64 addressing of small tensors
// then runs in the simulator and ptxas).
Type index_type(const Target& target, int64_t max_elements);
Operand imm_index(Type it, int64_t v);
// r * stride + x in index type `it`, without the multiply where the stride is 1.
Reg scaled_add(KernelBuilder& b, Type it, Reg r, int64_t stride, Reg x);

// A kernel name unique to its specialization: "<prefix>_<16 hex digits of hash>".
std::string kernel_name(const std::string& prefix, uint64_t hash);

// Threads per block and blocks for a grid-stride loop over n elements.
constexpr uint32_t kElementwiseThreads = 256;
kir::Dim3 elementwise_grid(int64_t n);

// for (i = global thread index; i < n; i += threads in grid) body(i), i of type it.
void grid_stride_loop(KernelBuilder& b, Type it, int64_t n, const std::function<void(Reg)>& body);

// The row-major coordinates of flat index i over `dims` (one register per dim, type of i).
std::vector<Reg> coordinates(KernelBuilder& b, Reg i, const std::vector<int64_t>& dims);
// base + sum_k coords[k] * strides[k], in the coordinates' type (zero strides are skipped).
Reg linear_offset(KernelBuilder& b, const std::vector<Reg>& coords, const std::vector<int64_t>& strides, int64_t base);
// The strides with which an input of shape `in` is read at the coordinates of a broadcast
// result of shape `out` (numpy rules: 0 along broadcast dims).
std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out);

// Loads element `index` of a buffer of dtype dt as f32 (i32 is converted).
Reg load_as_f32(KernelBuilder& b, DType dt, Reg base, Reg index);
// Stores an f32 value into element `index` of a buffer of dtype dt (i32: rounds toward zero;
// bf16: to nearest even, as a cast).
void store_from_f32(KernelBuilder& b, DType dt, Reg base, Reg index, Reg value);
kir::Type kir_type(DType dt);  // f32 -> f32, i32 -> s32, bf16 -> bf16; others throw

// A value expression evaluated in f32 over registers `inputs` (in0, in1, ...); shared subtrees
// are emitted once. Accuracy: exact IEEE for + - * / sqrt; exp (and sigmoid, tanh, silu built
// on it) within ~3 ulp; gelu and its gradient within 1e-5 relative (of s = sigmoid(2u) for the
// gradient: util.cpp); log within 2.5e-6 relative; pow within |y log2 x| 2^-22.6
// relative; sin/cos through sin/cos.approx after reduction to [-pi, pi] (absolute error
// ~1e-6 for |x| < 100). The .cpp states each derivation.
Reg emit_scalar_exp(KernelBuilder& b, const ScalarExp& e, const std::vector<Reg>& inputs);
// max(x, y) or min(x, y) in f32 that propagates NaN as the reference does (a NaN operand wins;
// ties take x); PTX's max/min would return the other operand.
Reg emit_minmax(KernelBuilder& b, bool is_max, Reg x, Reg y);

// An index expression evaluated in s64 over the output coordinates (converted to s64).
// Division and modulo by a constant only (floor semantics); other divisors are an error.
Reg emit_index_exp(KernelBuilder& b, const IndexExp& e, const std::vector<Reg>& coords);

// Ten rounds of Philox4x32 on counter c (4 x u32) with key k (2 x u32), as circuit/prims/philox.hpp.
std::vector<Reg> emit_philox(KernelBuilder& b, std::vector<Reg> c, std::vector<Reg> k);

// Structural hash of a kernel's parameters, shared arrays and statements (not its name).
uint64_t kernel_hash(const kir::Kernel& k);

// Text of the launch shape for summaries: "grid 12x1x1, block 256".
std::string launch_text(const Launch& l);

// Throws kiln::Error naming the op unless every value it reads or writes is f32 or i32.
void require_gpu_dtypes(const Circuit& c, const Op& op);

}  // namespace kiln::cuda
