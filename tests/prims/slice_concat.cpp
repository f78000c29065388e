// The cases of slice, concat, split (circuit/prims/slice_concat.cpp, cuda/lower/slice_concat.cpp).
#include "prim_cases.hpp"

namespace kiln::testing {

void slice_concat_cases(FamilyCases& c) {
  using se::in;
  // Gradients (f64 central differences).
  add_gradient(c, "slice_middle", {"slice"}, {F({4, 9})},
               [](Builder& b, const auto& x) { return b.slice(x[0], 1, 2, 7); });
  add_gradient(c, "slice_head", {"slice"}, {F({5, 3})},
               [](Builder& b, const auto& x) { return b.slice(x[0], 0, 0, 2); });
  add_gradient(c, "concat_three", {"concat"}, {F({2, 3}), F({2, 1}), F({2, 4})}, [](Builder& b, const auto& x) {
    return b.concat({x[0], x[1], x[2]}, 1);
  });
  add_gradient(c, "split_three_one_unused", {"split"}, {F({2, 7, 3})}, [](Builder& b, const auto& x) {
    std::vector<ValueId> p = b.split(x[0], 1, {2, 4, 1});
    return b.concat({p[2], p[0]}, 1);  // the middle piece gets no gradient
  });
  // Lowerings (f32 kernels against the Eigen reference).
  c.lowering.push_back({"slice",
                        {f32({4, 37, 3})},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.slice(x[0], 1, 5, 29); },
                        0});
  c.lowering.push_back({"concat",
                        {f32({2, 3, 5}), f32({2, 7, 5}), f32({2, 1, 5})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          return b.concat({x[0], x[1], x[2]}, 1);
                        },
                        0});
  // A gradient bucket's shape: flat pieces of uneven sizes, deep enough for the lowering's tree of
  // boundaries to have three levels.
  c.lowering.push_back({"concat_six_flat",
                        {f32({5}), f32({1}), f32({37}), f32({8}), f32({2}), f32({19})},
                        [](Builder& b, const std::vector<ValueId>& x) { return b.concat(x, 0); },
                        0});
  c.lowering.push_back({"split",
                        {f32({2, 11, 5})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          auto parts = b.split(x[0], 1, {4, 7});
                          return b.concat({parts[1], parts[0]}, 1);  // both pieces reach the output
                        },
                        0});
  // A bucket split back into its gradients: six flat pieces of uneven sizes, each scaled on its
  // own so that every piece is an output of the split (and a piece stored into another's place
  // shows).
  c.lowering.push_back({"split_six_flat",
                        {f32({72})},
                        [](Builder& b, const std::vector<ValueId>& x) {
                          auto parts = b.split(x[0], 0, {5, 1, 37, 8, 2, 19});
                          std::vector<ValueId> scaled;
                          for (size_t k = 0; k < parts.size(); ++k)
                            scaled.push_back(b.scale(parts[k], static_cast<double>(k + 1)));
                          return b.concat(scaled, 0);
                        },
                        0});
}

}  // namespace kiln::testing
