// Every family's cases, in the order of circuit/prims/families.hpp.
#include "prim_cases.hpp"

namespace kiln::testing {

FamilyCases all_prim_cases() {
  FamilyCases c;
  pointwise_cases(c);
  reduce_cases(c);
  matmul_cases(c);
  gather_cases(c);
  shape_ops_cases(c);
  slice_concat_cases(c);
  where_cases(c);
  cast_cases(c);
  constants_cases(c);
  random_cases(c);
  fused_rows_cases(c);
  multi_tensor_cases(c);
  fused_matmul_cases(c);
  column_sums_cases(c);
  attention_cases(c);
  all_reduce_cases(c);
  composites_cases(c);
  return c;
}

}  // namespace kiln::testing
