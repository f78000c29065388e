// Finite-difference checking of a Circuit's gradients: central differences in f64 against
// the gradients the reverse sweep builds. Used by the Prim and layer tests and by users
// through core's kiln::gradcheck.
#pragma once

#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>

namespace kiln::ad {

struct GradCheckOptions {
  // Element i is perturbed by h = step * max(1, |x_i|): a step relative to the element's size.
  // With richardson, the estimate is (4 D(h/2) - D(h)) / 3 from central differences D at h and
  // h/2, whose truncation error is O(h^4): a step large enough that rounding (about
  // 1e-16 |f| / h) stays far below small gradients, as a model's attention gradients at
  // initialization are. Without it, D(h) alone (O(h^2)), two evaluations per element.
  double step = 1e-4;
  bool richardson = true;
  double tolerance = 1e-6;  // passes when ||numeric - analytic|| / ||analytic|| < tolerance
  uint64_t seed = 1234;     // for the projection weights of a non-scalar output and the subsets
  // > 0: check this many elements per tensor, a seeded random subset (large models in seconds);
  // the norms then run over the subset.
  int64_t elements_per_tensor = 0;
};

// One checked tensor: its name, the norm-relative error and the element of largest difference.
struct GradCheckEntry {
  std::string name;
  Shape shape;
  double rel_error = 0;
  int64_t checked = 0;  // elements compared
  int64_t worst_index = -1;
  double worst_analytic = 0, worst_numeric = 0;
  // The norm of difference that the finite differences' rounding alone can give; a gradient
  // whose norm is under rounding_floor / tolerance is near_zero and passes when the difference
  // stays under the floor.
  double rounding_floor = 0;
  bool near_zero = false;
  bool ok = true;
};

struct GradCheckResult {
  bool ok = true;
  std::vector<double> rel_error;  // one per checked tensor
  std::vector<GradCheckEntry> entries;
  std::string report;  // a table: one line per tensor
};

// `c` is an f64 circuit whose externals are bound to `bindings` (in order); checks the
// gradient of `output` with respect to each external in `wrt`, named by `names` (default
// "input k"). A non-scalar output is reduced to sum(output * R) with fixed random R, which checks
// the full VJP. Relative error per tensor: ||n - a|| / max(||a||, rounding_floor / tolerance),
// the floor being what the differences' rounding can resolve (GradCheckEntry). A NaN or inf in either
// gradient is an error (kiln::Error naming the tensor and element), never a pass; so is a check
// of nothing (no tensor, or no element).
GradCheckResult check_gradients(const Circuit& c, ValueId output, const std::vector<ValueId>& wrt,
                                const std::vector<HostTensor>& bindings, const GradCheckOptions& opts = {},
                                const std::vector<std::string>& names = {});

}  // namespace kiln::ad
