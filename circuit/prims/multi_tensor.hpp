// The program of a `multi_tensor` op: one elementwise program applied to several tensors of
// different shapes in one op, as an optimizer updates every parameter. The multi-tensor merge
// (circuit/passes/merge_multi_tensor.cpp) builds it, the Eigen reference runs it group by group and
// cuda/lower/multi_tensor.cpp lowers it to one launch over all groups (or a few, when the
// kernel's parameter space would overflow).
//
// The op has `groups` groups. Group g reads `group_inputs` inputs (op inputs
// g * group_inputs + j) and every group reads the same `shared_inputs` inputs (after all the
// groups' inputs). A group's domain is the shape of its inputs: each group input has the
// domain's shape or one element (a scalar, read at every element); shared inputs have one
// element. Bodies read in_j (group input j) and in_{group_inputs + k} (shared input k).
// Without `sum`, output g * bodies + r has the group's domain shape and holds body r at every
// element; with `sum` (one body) it is a scalar [] holding the body's sum over the domain. With
// `sum` and a `total` body the op has one output instead, a scalar []: total(in0 = group 0's
// sum, in1 = group 1's, ...) (a gradient norm: sqrt of the sum of every parameter's squares).
#pragma once

#include <string>
#include <vector>

#include <kiln/circuit/prims/builder.hpp>

namespace kiln {

struct MultiTensorProgram {
  int groups = 0, group_inputs = 0, shared_inputs = 0;
  bool sum = false;
  std::vector<ScalarExp> bodies;
  bool has_total = false;
  ScalarExp total;

  // Op input j of group g, shared input k, output r of group g.
  size_t input(int g, int j) const { return static_cast<size_t>(g * group_inputs + j); }
  size_t shared(int k) const { return static_cast<size_t>(groups * group_inputs + k); }
  size_t output(int g, int r) const { return static_cast<size_t>(g) * bodies.size() + static_cast<size_t>(r); }
  // True if some body reads position `j` (a group input below group_inputs, else shared).
  bool reads(int j) const;

  Params to_params(DType dtype) const;
  static MultiTensorProgram from_params(const Params& p);  // throws kiln::Error on malformed params
  std::string describe() const;
};

// The domain of group g of an op with inputs `in`: its largest input's shape.
Shape multi_tensor_domain(const MultiTensorProgram& mp, const std::vector<ValueInfo>& in, int g);

}  // namespace kiln
