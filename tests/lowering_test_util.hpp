// Helpers of the lowering tests (test_lowering.cpp, test_matmul_lowering.cpp): a lowering case
// run in the simulator (or on a GPU) against the Eigen executor, and the kernels cases generate.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"

namespace kiln::testing {

// The case lowered for `target` and run on `rt` against Eigen. `dump`, where given, receives the
// lowered program's dump (its kernels and their summaries).
inline void check_case(const LoweringCase& lc, cuda::Runtime& rt, const Target& target, std::string* dump = nullptr) {
  Harness h(lc.inputs, lc.build, 7);
  HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  cuda::DeviceProgram dp(h.circuit, {h.output}, rt, target);
  if (dump) *dump = dp.dump();
  HostTensor got = dp.run(h.bindings)[0];
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  if (lc.tolerance == 0) {
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_EQ(got.get(i), want.get(i)) << lc.name << " element " << i;
  } else {
    EXPECT_LT(relative_error(got, want), lc.tolerance) << lc.name << "\n" << dp.dump();
  }
}

// The Targets every Prim family's cases run on, from one list (as ggml's test-backend-ops runs
// every backend): the CPU (the case optimized for it and run by the executor), and the fake
// driver lowering for sm_80 (mma.sync), for sm_90 with the choices a real H100 takes (wgmma), and
// for sm_80 on the 64-bit index path (taken on a GPU by tensors of 2^31 elements and more, which
// no test can afford).
struct NamedTarget {
  std::string name;
  Target target;
};
inline void PrintTo(const NamedTarget& t, std::ostream* os) { *os << t.name << " (" << t.target.str() << ")"; }
inline std::vector<NamedTarget> case_targets() {
  Target sm90 = cuda_target(90, /*fake=*/true), wide = cuda_target(80, /*fake=*/true);
  sm90.matmul.wgmma = true;
  wide.wide_indices = true;
  return {{"cpu", cpu_target()}, {"sm80", cuda_target(80, /*fake=*/true)}, {"sm90", sm90}, {"sm80_wide_indices", wide}};
}

// The case on `target`: a CUDA Target's lowering in the simulator (the fake runtime), or the CPU's
// optimized circuit on the executor, against Eigen's run of the recorded circuit.
inline void check_case_on(const LoweringCase& lc, const Target& target) {
  if (target.gpu()) return check_case(lc, fake_runtime(), target);
  Harness h(lc.inputs, lc.build, 7);
  const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  std::vector<ValueId> outs{h.output};
  const Circuit optimized = optimize(h.circuit, outs, target);
  const HostTensor got = execute(optimized, h.bindings, outs)[0];
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_LE(relative_error(got, want), lc.tolerance) << lc.name << "\n" << optimized.dump("optimized");
}

// For rt's device with the default choices.
inline void check_case(const LoweringCase& lc, cuda::Runtime& rt, std::string* dump = nullptr) {
  check_case(lc, rt, cuda::device_target(rt), dump);
}

// The cases lowered for `target` (kept alive in `programs`) and the kernels they generate.
inline std::vector<const kir::Kernel*> lowered_kernels(const std::vector<LoweringCase>& lcs,
                                                       std::vector<std::unique_ptr<cuda::DeviceProgram>>& programs,
                                                       const Target& target = cuda::device_target(fake_runtime())) {
  std::vector<const kir::Kernel*> kernels;
  for (const LoweringCase& lc : lcs) {
    Harness h(lc.inputs, lc.build, 7);
    programs.push_back(
        std::make_unique<cuda::DeviceProgram>(h.circuit, std::vector<ValueId>{h.output}, fake_runtime(), target));
    for (const auto& k : programs.back()->kernels()) kernels.push_back(k.launch->kernel.get());
  }
  return kernels;
}

}  // namespace kiln::testing
