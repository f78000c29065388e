// The cases of multi_tensor (circuit/prims/multi_tensor.cpp, cuda/lower/multi_tensor.cpp); no VJP: built after
// differentiation.
#include <kiln/circuit/prims/multi_tensor.hpp>

#include "prim_cases.hpp"

namespace kiln::testing {

void multi_tensor_cases(FamilyCases& c) {
  using se::in;
  // Lowerings (f32 kernels against the Eigen reference).
  // multi_tensor: groups of different sizes (one not a multiple of the block, one of a single
  // element), a group input that is a scalar in some groups and a tensor in others, a shared
  // scalar; two bodies. The outputs are flattened and concatenated to compare at once.
  c.lowering.push_back({"multi_tensor_map",
                        {f32({37, 45}), f32({}), f32({257}), f32({257}), f32({1}), f32({1}), f32({})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          MultiTensorProgram mp;
                          mp.groups = 3;
                          mp.group_inputs = 2;
                          mp.shared_inputs = 1;
                          mp.bodies = {se::in(0) * se::in(1) + se::in(2), se::exp(se::in(0) * se::c(0.5)) - se::in(1)};
                          std::vector<ValueId> outs =
                              b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope());
                          std::vector<ValueId> flat;
                          for (ValueId o : outs) flat.push_back(b.reshape(o, Shape{b.circuit().info(o).shape.numel()}));
                          return b.concat(flat, 0);
                        },
                        1e-6});
  // Sums: groups spanning many blocks and few; 170 groups of 3 addresses overflow one launch's
  // parameter space (480 addresses), so the map case below runs in two chunks.
  c.lowering.push_back({"multi_tensor_sum",
                        {f32({37, 45}), f32({}), f32({5000}), f32({}), f32({7}), f32({})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          MultiTensorProgram mp;
                          mp.groups = 3;
                          mp.group_inputs = 2;
                          mp.sum = true;
                          mp.bodies = {se::in(0) * se::in(0) + se::in(1)};
                          std::vector<ValueId> outs =
                              b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope());
                          std::vector<ValueId> flat;
                          for (ValueId o : outs) flat.push_back(b.reshape(o, Shape{1}));
                          return b.concat(flat, 0);
                        },
                        1e-5});
  // A total over the group sums, in 2 chunks of launches sharing one arrival counter.
  c.lowering.push_back({"multi_tensor_total", std::vector<InputSpec>(500, f32({300})),
                        [](Builder& b, const std::vector<ValueId>& x) {
                          MultiTensorProgram mp;
                          mp.groups = 500;
                          mp.group_inputs = 1;
                          mp.sum = true;
                          mp.bodies = {se::in(0) * se::in(0)};
                          mp.has_total = true;
                          ScalarExp sum = se::in(0);
                          for (int g = 1; g < 500; ++g) sum = sum + se::in(g)*se::c(g % 3 == 0 ? 2.0 : 1.0);
                          mp.total = se::sqrt(sum);
                          return b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope())[0];
                        },
                        1e-5});
  c.lowering.push_back({"multi_tensor_chunked", std::vector<InputSpec>(340, f32({5})),
                        [](Builder& b, const std::vector<ValueId>& x) {
                          MultiTensorProgram mp;
                          mp.groups = 170;
                          mp.group_inputs = 2;
                          mp.bodies = {se::in(0) - se::in(1) * se::c(0.25)};
                          std::vector<ValueId> outs =
                              b.circuit().add_op("multi_tensor", mp.to_params(DType::f32), x, b.scope());
                          return b.concat(outs, 0);
                        },
                        0});
}

}  // namespace kiln::testing
