// bf16_as_rounded_f32: the CPU's form of bf16 operands. A product of two bf16 values is exact in
// f32, so a GEMM in f32 over operands rounded to bf16 gives the same products, accumulated in f32,
// as a bf16 GEMM with f32 accumulation. On a CPU without bf16 products a bf16 matmul would widen
// both operands to f32 copies on every call (a pass over memory each); holding the rounded values
// in f32 from the start does no such pass, and the rounding is a pointwise op that fuse_pointwise
// and fuse_rows fold into the producer (its f32 value rounded in registers).
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

// On a CPU Target whose bf16 products are rounded_f32 (the GPU keeps bf16 storage for its tensor
// cores, and so does a CPU whose products are oneDNN's bf16 kernels), every bf16 value that casts,
// view ops (reshape, permute, broadcast, slice, concat, split, stop_gradient, gather_rows) and
// matmuls make and read is held in f32, rounded to bf16:
//   cast(x: f32 -> bf16)        -> pointwise round_bf16(x)     (f32)
//   cast(x: bf16 -> f32)        -> x's f32 form                (exact)
//   matmul(a: bf16, b: bf16)    -> matmul of the f32 forms     (the same f32 product, bit for bit)
//   view op of bf16 values      -> the same op of the f32 forms
// Any other op that reads or writes bf16 keeps bf16 values: it reads the f32 form cast to bf16
// (exact) and its bf16 outputs are cast to f32 where a rewritten op reads them. A bf16 external
// is cast to f32 before its first rewritten reader; a requested bf16 output stays bf16. The
// results are bit for bit those of the circuit it was given. Run after fuse_attention (whose
// pattern reads the casts) and before the other fusion passes.
Circuit bf16_as_rounded_f32(const Circuit& c, std::vector<ValueId>& outputs, const Target& target);

}  // namespace kiln
