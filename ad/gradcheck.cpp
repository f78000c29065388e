// Central-difference gradient checks of Circuits in f64.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include <kiln/ad/backward.hpp>
#include <kiln/ad/gradcheck.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/philox.hpp>

namespace kiln::ad {

namespace {
void require_finite(const HostTensor& t, const std::string& what, const std::string& name) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.get(i)))
      throw Error("gradient check: the " + what + " gradient of " + name + " is " + std::to_string(t.get(i)) +
                  " at element " + std::to_string(i));
}

// The elements to check: all, or a seeded random subset of k (distinct, ascending).
std::vector<int64_t> elements_to_check(int64_t n, int64_t k, uint64_t seed, size_t tensor) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  if (k <= 0 || k >= n) return all;
  for (int64_t i = 0; i < k; ++i) {  // partial Fisher-Yates
    const uint64_t r = philox_bits(seed, 11 + static_cast<uint32_t>(tensor), static_cast<uint64_t>(i));
    std::swap(all[static_cast<size_t>(i)],
              all[static_cast<size_t>(i + static_cast<int64_t>(r % static_cast<uint64_t>(n - i)))]);
  }
  all.resize(static_cast<size_t>(k));
  std::sort(all.begin(), all.end());
  return all;
}
}  // namespace

GradCheckResult check_gradients(const Circuit& c, ValueId output, const std::vector<ValueId>& wrt,
                                const std::vector<HostTensor>& bindings, const GradCheckOptions& opts,
                                const std::vector<std::string>& names) {
  if (wrt.empty()) throw Error("gradient check: nothing to check (no input or parameter to differentiate)");
  if (!names.empty() && names.size() != wrt.size())
    throw Error("gradient check: " + std::to_string(names.size()) + " names for " + std::to_string(wrt.size()) +
                " tensors");
  if (!(opts.step > 0)) throw Error("gradient check: the step must be > 0");
  auto name_of = [&](size_t w) { return names.empty() ? "input " + std::to_string(w) : names[w]; };
  for (size_t w = 0; w < wrt.size(); ++w)
    if (c.info(wrt[w]).dtype != DType::f64)
      throw Error("gradient check: tensors must be f64, " + name_of(w) + " is " + dtype_name(c.info(wrt[w]).dtype) +
                  " (convert with cast or Module::to)");
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
  // The finite differences' rounding: each evaluation of f is off by a few ulps of |f|, so an
  // estimate at step h is off by about eps |f| / h (Richardson's combination triples it). A
  // gradient smaller than what that rounding allows to resolve is compared in absolute terms
  // (as PyTorch's gradcheck does with its atol): a zero gradient, say of a bias on symmetric
  // data, passes when the numeric one is rounding noise. kRoundingMargin is far above the
  // observed noise (1-3 eps |f| / h) and far below what a wrong rule changes.
  constexpr double kRoundingMargin = 100.0;
  const double f_scale = std::max(1.0, std::fabs(forward.run(binds)[0].get(0)));
  const double noise_per_unit_step =
      kRoundingMargin * std::numeric_limits<double>::epsilon() * f_scale * (opts.richardson ? 3.0 : 1.0);
  GradCheckResult res;
  size_t next = 0;
  int64_t total_checked = 0;
  for (size_t w = 0; w < wrt.size(); ++w) {
    size_t slot = 0;
    while (slot < fwd.externals().size() && fwd.externals()[slot] != wrt[w]) ++slot;
    if (slot == fwd.externals().size())
      throw Error("gradient check: " + name_of(w) + " (%" + std::to_string(wrt[w]) +
                  ") is not an external input of the circuit");
    HostTensor saved = binds[slot];
    HostTensor x = saved.clone();
    binds[slot] = x;
    const HostTensor a = grads[w] == kNoValue ? HostTensor::zeros(DType::f64, x.shape()) : analytic[next++];
    require_finite(a, "analytic", name_of(w));
    GradCheckEntry e;
    e.name = name_of(w);
    e.shape = x.shape();
    double diff = 0, norm = 0, worst = -1, floor_sq = 0;
    for (int64_t i : elements_to_check(x.numel(), opts.elements_per_tensor, opts.seed, w)) {
      const double x0 = x.get(i), h = opts.step * std::max(1.0, std::fabs(x0));
      auto central = [&](double step) {
        x.set(i, x0 + step);
        const double fp = forward.run(binds)[0].get(0);
        x.set(i, x0 - step);
        const double fm = forward.run(binds)[0].get(0);
        x.set(i, x0);
        return (fp - fm) / (2.0 * step);
      };
      floor_sq += (noise_per_unit_step / h) * (noise_per_unit_step / h);
      const double d1 = central(h);
      const double numeric = opts.richardson ? (4.0 * central(h / 2) - d1) / 3.0 : d1;
      if (!std::isfinite(numeric))
        throw Error("gradient check: the numeric gradient of " + e.name + " is " + std::to_string(numeric) +
                    " at element " + std::to_string(i));
      const double d = numeric - a.get(i);
      diff += d * d;
      norm += a.get(i) * a.get(i);
      if (std::fabs(d) > worst)
        worst = std::fabs(d), e.worst_index = i, e.worst_analytic = a.get(i), e.worst_numeric = numeric;
      ++e.checked;
    }
    binds[slot] = saved;
    total_checked += e.checked;
    e.rounding_floor = std::sqrt(floor_sq);
    e.near_zero = std::sqrt(norm) < e.rounding_floor / opts.tolerance;
    e.rel_error = std::sqrt(diff) / std::max({std::sqrt(norm), e.rounding_floor / opts.tolerance, 1e-300});
    e.ok = e.rel_error < opts.tolerance;
    res.ok = res.ok && e.ok;
    res.rel_error.push_back(e.rel_error);
    char line[400];
    std::snprintf(line, sizeof line,
                  "%-44s %-14s %8lld elements  rel. error %.2e (tolerance %.0e) %-6s worst [%lld]: analytic %.6e "
                  "numeric %.6e%s\n",
                  e.name.c_str(), e.shape.str().c_str(), static_cast<long long>(e.checked), e.rel_error, opts.tolerance,
                  e.ok ? "ok" : "FAILED", static_cast<long long>(e.worst_index), e.worst_analytic, e.worst_numeric,
                  e.near_zero ? "  (gradient at rounding level: compared absolutely)" : "");
    res.report += line;
    res.entries.push_back(std::move(e));
  }
  if (total_checked == 0) throw Error("gradient check: nothing to check (every tensor has zero elements)");
  return res;
}

}  // namespace kiln::ad
