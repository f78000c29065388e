// The cases of all_reduce, reduce_scatter and all_gather (circuit/prims/all_reduce.cpp,
// cuda/lower/all_reduce.cpp): with one rank (the tests' world) each is a copy on both backends. Several ranks:
// tests/test_data_parallel.cpp.
#include "prim_cases.hpp"

namespace kiln::testing {

void all_reduce_cases(FamilyCases& c) {
  c.lowering.push_back(
      {"all_reduce_one_rank",
       {f32({1000})},
       [](Builder& b, const std::vector<ValueId>& x) { return b.circuit().add_op(PrimId::all_reduce, {}, {x[0]})[0]; },
       0.0});
  for (const PrimId prim : {PrimId::reduce_scatter, PrimId::all_gather})
    c.lowering.push_back({std::string(prim_name(prim)) + "_one_rank",
                          {f32({1000})},
                          [prim](Builder& b, const std::vector<ValueId>& x) {
                            Params one;
                            one.ints = {1};
                            return b.circuit().add_op(prim, one, {x[0]})[0];
                          },
                          0.0});
}

}  // namespace kiln::testing
