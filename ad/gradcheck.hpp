// Finite-difference checking of a Circuit's gradients: central differences in f64 against
// the gradients the reverse sweep builds. Used by the Prim and layer tests and by users
// through core's kiln::gradcheck.
#pragma once

#include <string>
#include <vector>

#include "circuit/ir/circuit.hpp"

namespace kiln::ad {

struct GradCheckOptions {
  double step = 1e-6;       // central-difference step h
  double tolerance = 1e-6;  // passes when ||numeric - analytic|| / ||analytic|| < tolerance
  uint64_t seed = 1234;     // for the projection weights of a non-scalar output
};

struct GradCheckResult {
  bool ok = true;
  std::vector<double> rel_error;  // one per checked input
  std::string report;             // one line per input
};

// `c` is an f64 circuit whose externals are bound to `bindings` (in order); checks the
// gradient of `output` with respect to each external in `wrt`. A non-scalar output is
// reduced to sum(output * R) with fixed random R, which checks the full VJP. Relative error
// per input: ||n - a|| / max(||a||, 1e-12). A NaN or inf in either gradient is an error
// (kiln::Error naming the input and element), never a pass.
GradCheckResult check_gradients(const Circuit& c, ValueId output, const std::vector<ValueId>& wrt,
                                const std::vector<HostTensor>& bindings, const GradCheckOptions& opts = {});

}  // namespace kiln::ad
