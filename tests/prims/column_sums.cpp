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
  // and rows of a multiple of 4: the quad kernel (four columns a lane), three column groups of
  // 128, the last partial.
  c.lowering.push_back(
      {"column_sums_row_split",
       {f32({3, 101, 300}), f32({3, 101, 1}), f32({300})},
       [](Builder& b, const std::vector<ValueId>& x) {
         const ColumnSumsParams p{Shape{3, 101, 300}, {se::in(0) * se::in(1), se::in(0) + se::in(2)}, DType::f32};
         std::vector<ValueId> outs = b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope());
         return b.concat(outs, 1);
       },
       1e-5});
  // The same rows of 301 columns: the kernel of a thread per column, split into chunks, two
  // column tiles, the second partial.
  c.lowering.push_back(
      {"column_sums_row_split_odd_columns",
       {f32({3, 101, 301}), f32({3, 101, 1}), f32({301})},
       [](Builder& b, const std::vector<ValueId>& x) {
         const ColumnSumsParams p{Shape{3, 101, 301}, {se::in(0) * se::in(1), se::in(0) + se::in(2)}, DType::f32};
         std::vector<ValueId> outs = b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope());
         return b.concat(outs, 1);
       },
       1e-5});
  // Quads in one chunk (40 rows: the block's warps' sums are the result), two column groups, the
  // second of one quad; three sums, one reading a per-column input.
  c.lowering.push_back(
      {"column_sums_quads_one_chunk",
       {f32({2, 20, 132}), f32({2, 20, 1}), f32({132})},
       [](Builder& b, const std::vector<ValueId>& x) {
         const ColumnSumsParams p{
             Shape{2, 20, 132}, {se::in(0) * se::in(1), se::in(0), se::tanh(se::in(0)) + se::in(2)}, DType::f32};
         std::vector<ValueId> outs = b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope());
         return b.concat(outs, 1);
       },
       1e-5});
  // Quads over 4000 rows of 8 columns: 63 chunks of 64 rows (the last 32), which the last block's
  // 8 warps add 8 (or 7) each, in trips of 4 and a rest.
  c.lowering.push_back({"column_sums_quads_many_chunks",
                        {f32({4, 1000, 8}), f32({4, 1000, 1})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          const ColumnSumsParams p{Shape{4, 1000, 8}, {se::in(0) * se::in(1)}, DType::f32};
                          return b.circuit().add_op(PrimId::column_sums, p.to_params(), x, b.scope())[0];
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
