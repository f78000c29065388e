// The cases of column_sums (circuit/prims/column_sums.cpp, cuda/lower/column_sums.cpp); no VJP: built after
// differentiation.
#include "prim_cases.hpp"

namespace kiln::testing {

void column_sums_cases(FamilyCases& c) {
  using se::in;
  // Lowerings (f32 kernels against the Eigen reference).
  // column_sums: three bodies over a (3, 37, 70) domain, inputs broadcast per row and per column.
  c.lowering.push_back(
      {"column_sums",
       {f32({3, 37, 70}), f32({3, 37, 1}), f32({70})},
       [](Builder& b, const std::vector<ValueId>& x) {
         const ColumnSumsParams p{Shape{3, 37, 70},
                                  {se::in(0) * se::in(1), se::in(0), se::tanh(se::in(0)) + se::in(2) * se::in(1)},
                                  DType::f32};
         std::vector<ValueId> outs = b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope());
         return b.concat(outs, 1);
       },
       1e-5});
  // Enough rows to split into chunks across blocks (303 rows: 5 chunks of 61, the last short),
  // and two column tiles, the second partial.
  c.lowering.push_back(
      {"column_sums_row_split",
       {f32({3, 101, 300}), f32({3, 101, 1}), f32({300})},
       [](Builder& b, const std::vector<ValueId>& x) {
         const ColumnSumsParams p{Shape{3, 101, 300}, {se::in(0) * se::in(1), se::in(0) + se::in(2)}, DType::f32};
         std::vector<ValueId> outs = b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope());
         return b.concat(outs, 1);
       },
       1e-5});
  // No rows: zeros.
  c.lowering.push_back({"column_sums_no_rows",
                        {f32({0, 5})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          const ColumnSumsParams p{Shape{0, 5}, {se::in(0)}, DType::f32};
                          return b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope())[0];
                        },
                        0});
  // 16400 rows of one column: 256 chunks of 65 rows would leave the last three empty (they start
  // past the rows), so 253 chunks run.
  c.lowering.push_back({"column_sums_many_rows",
                        {f32({16400, 1})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          const ColumnSumsParams p{Shape{16400, 1}, {se::in(0)}, DType::f32};
                          return b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope())[0];
                        },
                        1e-5});
}

}  // namespace kiln::testing
