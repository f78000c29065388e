// The cases of fused_rows (circuit/prims/fused_rows.cpp, cuda/lower/fused_rows.cpp); no VJP: built after
// differentiation.
#include <cmath>

#include <kiln/circuit/prims/fused_rows.hpp>

#include "prim_cases.hpp"

namespace kiln::testing {

void fused_rows_cases(FamilyCases& c) {
  using se::in;
  // Lowerings (f32 kernels against the Eigen reference).
  // fused_rows: an i32 mask and inputs broadcast along rows and columns; max, sum and mean
  // reductions (the later ones reading the earlier); rows (37) not a multiple of the 8 rows a
  // block takes, row length (45) not a multiple of the warp. Output 0 is per element, 1 per row.
  // The "_wide" pair: rows of 300, two whole trips of the lanes' 4-column unrolled loop and a
  // remainder of 44.
  for (int64_t width : {45, 300})
    for (int which : {0, 1}) {
      const std::string name = std::string(which == 0 ? "fused_rows_row_output" : "fused_rows_per_row_output") +
                               (width == 45 ? "" : "_wide");
      c.lowering.push_back(
          {name,
           {f32({37, width}), i32({1, width}, 0, 2), f32({width}, 0.5, 1.5), f32({37, 1})},
           [which, width](Builder& b, const std::vector<ValueId>& x) {
             using se::in;
             const ScalarExp masked = se::select(in(1), in(0), se::c(-3.0));
             RowProgram rp;
             rp.inputs = 4;
             rp.domain = Shape{37, width};
             rp.reduction_kinds = {ReduceKind::Max, ReduceKind::Sum, ReduceKind::Mean};
             rp.reduction_bodies = {masked, se::exp(masked - in(4)), in(0) * in(2) + in(3)};
             rp.output_per_row = {false, true};
             rp.output_bodies = {se::exp(masked - in(4)) / in(5) * in(2), se::log(in(5)) + in(6) * in(3)};
             return b.circuit().add_op("fused_rows", rp.to_params(DType::f32), x, b.scope())[which];
           },
           1e-5});
    }
  // A softmax's statistics (max, then sum of exp(x - max)), which the kernel takes in one pass
  // with a running max: scores spread over +-60 (the sum is rescaled each time a lane's max
  // grows), about half of them -inf (masked; rows that start with runs of them, where -inf -
  // -inf must not turn into NaN), rows of 1000 (7 unrolled trips and a remainder), of 45, and of
  // 20 (lanes 20-31 see no element: their running max stays -inf and adds nothing).
  for (int64_t width : {20, 45, 1000})
    c.lowering.push_back(
        {"fused_rows_online_softmax_" + std::to_string(width),
         {f32({19, width}, -2.0, 2.0), i32({19, width}, 0, 2)},
         [width](Builder& b, const std::vector<ValueId>& x) {
           using se::in;
           const ScalarExp scores = se::select(in(1), in(0) * se::c(30.0), se::c(-INFINITY));
           RowProgram rp;
           rp.inputs = 2;
           rp.domain = Shape{19, width};
           rp.reduction_kinds = {ReduceKind::Max, ReduceKind::Sum};
           rp.reduction_bodies = {scores, se::exp(scores - in(2))};
           rp.output_per_row = {false, true};
           rp.output_bodies = {se::exp(scores - in(2)) / in(3), in(2) + se::log(in(3))};
           const std::vector<ValueId> out = b.circuit().add_op("fused_rows", rp.to_params(DType::f32), x, b.scope());
           return b.concat({b.reshape(out[0], Shape{19 * width, 1}), out[1]}, 0);  // probabilities, then lse
         },
         1e-5});
}

}  // namespace kiln::testing
