// Central-difference gradient checks of Circuits in f64.
#include "ad/gradcheck.hpp"

#include <cmath>
#include <cstdio>

#include "ad/backward.hpp"
#include "circuit/exec/executor.hpp"
#include "circuit/ir/error.hpp"
#include "circuit/prims/philox.hpp"

namespace kiln::ad {

namespace {
void require_finite(const HostTensor& t, const std::string& what, size_t input) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.get(i)))
      throw Error("gradient check: " + what + " gradient of input " + std::to_string(input) + " is " +
                  std::to_string(t.get(i)) + " at element " + std::to_string(i));
}
}  // namespace

GradCheckResult check_gradients(const Circuit& c, ValueId output, const std::vector<ValueId>& wrt,
                                const std::vector<HostTensor>& bindings, const GradCheckOptions& opts) {
  for (ValueId w : wrt)
    if (c.info(w).dtype != DType::f64)
      throw Error("gradient check: inputs must be f64, input %" + std::to_string(w) + " is " +
                  dtype_name(c.info(w).dtype) + " (convert with cast or Module::to)");
  if (c.info(output).dtype != DType::f64) throw Error("gradient check: the output must be f64");

  // loss = sum(output * R), R fixed and random, bound as one more external.
  Circuit fwd = c;
  std::vector<HostTensor> binds = bindings;
  ValueId loss = output;
  {
    Builder b(fwd, "gradcheck");
    if (fwd.info(output).shape.rank() > 0) {
      HostTensor r = HostTensor::zeros(DType::f64, fwd.info(output).shape);
      for (int64_t i = 0; i < r.numel(); ++i)
        r.set(i, 2.0 * bits_to_uniform(philox_bits(opts.seed, 7, static_cast<uint64_t>(i))) - 1.0);
      ValueId rv = fwd.add_external({r.shape(), DType::f64}, ValueRole::Input, "projection");
      binds.push_back(r);
      loss = b.reduce_all(ReduceKind::Sum, b.mul(output, rv));
    }
  }
  Circuit both = fwd;
  std::vector<ValueId> grads;
  {
    Builder b(both, "gradcheck");
    grads = backward(b, loss, wrt);
  }
  std::vector<ValueId> want;
  for (ValueId g : grads)
    if (g != kNoValue) want.push_back(g);
  std::vector<HostTensor> analytic = execute(both, binds, want);

  Program forward(fwd, {loss});
  GradCheckResult res;
  size_t next = 0;
  for (size_t w = 0; w < wrt.size(); ++w) {
    size_t slot = 0;
    while (slot < fwd.externals().size() && fwd.externals()[slot] != wrt[w]) ++slot;
    if (slot == fwd.externals().size())
      throw Error("gradient check: %" + std::to_string(wrt[w]) + " is not an external input of the circuit");
    HostTensor saved = binds[slot];
    HostTensor x = saved.clone();
    binds[slot] = x;
    HostTensor numeric = HostTensor::zeros(DType::f64, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      double x0 = x.get(i);
      x.set(i, x0 + opts.step);
      double fp = forward.run(binds)[0].get(0);
      x.set(i, x0 - opts.step);
      double fm = forward.run(binds)[0].get(0);
      x.set(i, x0);
      numeric.set(i, (fp - fm) / (2.0 * opts.step));
    }
    binds[slot] = saved;
    HostTensor a = grads[w] == kNoValue ? HostTensor::zeros(DType::f64, x.shape()) : analytic[next++];
    require_finite(numeric, "numeric", w);
    require_finite(a, "analytic", w);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      diff += (numeric.get(i) - a.get(i)) * (numeric.get(i) - a.get(i));
      norm += a.get(i) * a.get(i);
    }
    double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-12);
    res.rel_error.push_back(rel);
    bool ok = rel < opts.tolerance;
    res.ok = res.ok && ok;
    char line[200];
    std::snprintf(line, sizeof line, "input %zu %s: |numeric - analytic| / |analytic| = %.3e (tolerance %.1e) %s\n", w,
                  x.shape().str().c_str(), rel, opts.tolerance, ok ? "ok" : "FAILED");
    res.report += line;
  }
  return res;
}

}  // namespace kiln::ad
