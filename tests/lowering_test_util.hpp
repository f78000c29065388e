// Helpers of the lowering tests (test_lowering.cpp, test_matmul_lowering.cpp): a lowering case
// run in the simulator (or on a GPU) against the Eigen executor, and the kernels cases generate.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"

namespace kiln::testing {

// `dump`, where given, receives the lowered program's dump (its kernels and their summaries).
inline void check_case(const LoweringCase& lc, cuda::Runtime& rt, std::string* dump = nullptr) {
  Harness h(lc.inputs, lc.build, 7);
  HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  cuda::DeviceProgram dp(h.circuit, {h.output}, rt);
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

// The cases lowered (kept alive in `programs`) and the kernels they generate.
inline std::vector<const kir::Kernel*> lowered_kernels(const std::vector<LoweringCase>& lcs,
                                                       std::vector<std::unique_ptr<cuda::DeviceProgram>>& programs) {
  std::vector<const kir::Kernel*> kernels;
  for (const LoweringCase& lc : lcs) {
    Harness h(lc.inputs, lc.build, 7);
    programs.push_back(
        std::make_unique<cuda::DeviceProgram>(h.circuit, std::vector<ValueId>{h.output}, fake_runtime()));
    for (const auto& k : programs.back()->kernels()) kernels.push_back(k.launch->kernel.get());
  }
  return kernels;
}

}  // namespace kiln::testing
