// The cases of fused_matmul (circuit/prims/fused_matmul.cpp, cuda/lower/matmul.cpp); no VJP: built after
// differentiation.
#include <kiln/circuit/prims/fused_matmul.hpp>

#include "prim_cases.hpp"

namespace kiln::testing {

void fused_matmul_cases(FamilyCases& c) {
  using se::in;
  // Lowerings (f32 kernels against the Eigen reference).
  // fused_matmul: attention-like views (a is (b, t, h, d) read as (b, h) x t x d with a
  // prologue; b broadcasts over the first batch dim and is read along its rows), two epilogues
  // with a broadcast bias and a residual, stored permuted, and the row sums of a; and a
  // split-like offset view over several tiles in both directions, with row sums (only the first
  // tile column writes them). The outputs are flattened and concatenated to compare at once.
  c.lowering.push_back(
      {"fused_matmul_views_epilogues",
       {f32({2, 9, 3, 70}), f32({3, 70, 11}), f32({11}), f32({2, 3, 9, 11})},
       [](Builder& b, const std::vector<ValueId>& x) {
         FusedMatmul f;
         f.batch = {2, 3};
         f.m = 9, f.n = 11, f.k = 70;
         // Prologues that are not 0 at 0: K = 70 is no multiple of the tile, so the zero
         // fill past K matters.
         f.a = {0, {9 * 3 * 70, 70}, 3 * 70, 1, se::in(0) * se::c(0.5) + se::c(0.125)};
         f.b = {0, {0, 70 * 11}, 1, 11, se::tanh(se::in(0)) + se::c(0.25)};
         f.extras = 2;
         f.epilogues = {se::gelu(se::in(0) + se::in(1)), (se::in(0) + se::in(1)) * se::in(2)};
         f.out_shape = Shape{2, 9, 3, 11};
         f.out_batch = {9 * 3 * 11, 11};
         f.out_row = 3 * 11, f.out_col = 1;
         f.a_row_sums = true;
         f.row_sums_shape = Shape{2, 3, 9};
         std::vector<ValueId> outs = b.circuit().add_op("fused_matmul", f.to_params(DType::f32), x, b.scope());
         return b.concat(
             {b.reshape(outs[0], Shape{594}), b.reshape(outs[1], Shape{594}), b.reshape(outs[2], Shape{54})}, 0);
       },
       1e-5});
  c.lowering.push_back({"fused_matmul_offset_view",
                        {f32({70, 3 * 45}), f32({45, 91})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          FusedMatmul f = FusedMatmul::plain(Shape{70, 45}, Shape{45, 91}, false, false);
                          f.a.offset = 45;
                          f.a.row_stride = 3 * 45;
                          f.epilogues = {se::in(0) * se::c(2.0)};
                          f.a_row_sums = true;
                          f.row_sums_shape = Shape{1, 70};
                          std::vector<ValueId> outs =
                              b.circuit().add_op("fused_matmul", f.to_params(DType::f32), x, b.scope());
                          return b.concat({b.reshape(outs[0], Shape{70 * 91}), b.reshape(outs[1], Shape{70})}, 0);
                        },
                        1e-5});
  // Mixed precision as the matmul fusion leaves it: a read in f32 through a rounding to bf16 (a
  // cast fused in), b stored in bf16 (a weight's cast), f32 bias epilogue and row sums of a. Both
  // sides multiply the same bf16 values exactly: only the order of the sums differs.
  c.lowering.push_back({"fused_matmul_bf16_rounded_and_stored",
                        {f32({67, 45}), f32({91, 45}), f32({91})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          FusedMatmul f = FusedMatmul::plain(Shape{67, 45}, Shape{91, 45}, false, true);
                          f.a.prologue = se::round_bf16(se::in(0));
                          f.extras = 1;
                          f.epilogues = {se::in(0) + se::in(1)};
                          f.a_row_sums = true;
                          f.row_sums_shape = Shape{67};
                          std::vector<ValueId> outs =
                              b.circuit().add_op("fused_matmul", f.to_params(DType::f32),
                                                 {x[0], b.cast(x[1], DType::bf16), x[2]}, b.scope());
                          return b.concat({b.reshape(outs[0], Shape{67 * 91}), outs[1]}, 0);
                        },
                        1e-5});
}

}  // namespace kiln::testing
