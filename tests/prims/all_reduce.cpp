// The cases of all_reduce (circuit/prims/all_reduce.cpp, cuda/lower/all_reduce.cpp): with one
// rank (the tests' world) it is a copy on both backends. Several ranks: tests/test_data_parallel.cpp.
#include "prim_cases.hpp"

namespace kiln::testing {

void all_reduce_cases(FamilyCases& c) {
  c.lowering.push_back(
      {"all_reduce_one_rank",
       {f32({1000})},
       [](Builder& b, const std::vector<ValueId>& x) { return b.circuit().add_op(PrimId::all_reduce, {}, {x[0]})[0]; },
       0.0});
}

}  // namespace kiln::testing
