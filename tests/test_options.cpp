// The KILN_* variables (circuit/ir/options.hpp) and the pass pipeline's switch
// (circuit/passes/pipeline.hpp): malformed values and unknown names are reported, not ignored.
#include <gtest/gtest.h>

#include <algorithm>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/options.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/builder.hpp>

#include "scoped_env.hpp"

namespace kiln {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(Options, AMisspeltKilnVariableIsReportedAndKnownOnesAreNot) {
  testing::ScopedEnv typo("KILN_NUM_THRAEDS", "1");
  testing::ScopedEnv known("KILN_PROFILE", "5");
  testing::ScopedEnv script("KILN_CHECK_LIMIT_GPT2", "900");  // gpu-check's KILN_CHECK_* family
  const std::vector<std::string> unknown = options::unknown_variables();
  EXPECT_TRUE(contains(unknown, "KILN_NUM_THRAEDS"));
  EXPECT_FALSE(contains(unknown, "KILN_PROFILE"));
  EXPECT_FALSE(contains(unknown, "KILN_CHECK_LIMIT_GPT2"));
}

TEST(Options, AMalformedThreadCountNamesTheVariableAndTheRange) {
  for (const char* bad : {"zero", "0", "4097", "2x"}) {
    testing::ScopedEnv threads("KILN_NUM_THREADS", bad);
    try {
      options::num_threads();
      ADD_FAILURE() << "accepted KILN_NUM_THREADS=" << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KILN_NUM_THREADS: expected a thread count from 1 to 4096"),
                std::string::npos)
          << e.what();
    }
  }
  testing::ScopedEnv threads("KILN_NUM_THREADS", "3");
  EXPECT_EQ(options::num_threads(), 3);
}

TEST(Options, TheBf16MmaSwitchIsOnByDefaultAndTakesOnlyZeroOrOne) {
  {
    testing::ScopedEnv unset("KILN_BF16_MMA", "");  // as if unset
    EXPECT_TRUE(options::bf16_mma());
  }
  {
    testing::ScopedEnv off("KILN_BF16_MMA", "0");
    EXPECT_FALSE(options::bf16_mma());
  }
  testing::ScopedEnv bad("KILN_BF16_MMA", "yes");
  try {
    options::bf16_mma();
    ADD_FAILURE() << "accepted KILN_BF16_MMA=yes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_BF16_MMA: expected 0 or 1, received 'yes'"), std::string::npos)
        << e.what();
  }
}

// exp(tanh(x)): two pointwise ops that fuse_pointwise makes one (and, without it, fuse_rows).
Circuit chain(std::vector<ValueId>& outputs) {
  Circuit c;
  ValueId x = c.add_external({Shape{4}, DType::f32}, ValueRole::Input, "x");
  Builder b(c);
  outputs = {b.pointwise(se::exp(se::in(0)), {b.pointwise(se::tanh(se::in(0)), {x})})};
  return c;
}

TEST(Pipeline, DisablingAPassByNameSkipsIt) {
  std::vector<ValueId> outputs;
  Circuit c = chain(outputs);
  std::vector<ValueId> fused_outputs = outputs;
  EXPECT_EQ(optimize(c, fused_outputs, {}).ops().size(), 1u);
  testing::ScopedEnv off("KILN_DISABLE_PASSES", "cse,fuse_pointwise,fuse_rows");
  EXPECT_EQ(optimize(c, outputs, {}).ops().size(), 2u);
}

TEST(Pipeline, AnUnknownPassNameIsAnErrorListingTheKnownOnes) {
  std::vector<ValueId> outputs;
  Circuit c = chain(outputs);
  testing::ScopedEnv off("KILN_DISABLE_PASSES", "fuse_pointwse");
  try {
    optimize(c, outputs, {});
    FAIL() << "a misspelt pass name was ignored";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no pass is named 'fuse_pointwse'"), std::string::npos) << what;
    for (const PassInfo& p : pipeline_passes()) EXPECT_NE(what.find(p.name), std::string::npos) << what;
  }
}

TEST(Pipeline, GpuOnlyPassesRunOnlyForGpuPlans) {
  // x @ w then + bias: fuse_matmul absorbs the add as an epilogue, only in a GPU plan.
  Circuit c;
  ValueId x = c.add_external({Shape{4, 8}, DType::f32}, ValueRole::Input, "x");
  ValueId w = c.add_external({Shape{8, 3}, DType::f32}, ValueRole::Input, "w");
  ValueId bias = c.add_external({Shape{3}, DType::f32}, ValueRole::Input, "bias");
  Builder b(c);
  std::vector<ValueId> cpu_outputs = {b.add(b.matmul(x, w), bias)};
  std::vector<ValueId> gpu_outputs = cpu_outputs;
  EXPECT_EQ(optimize(c, cpu_outputs, {.gpu = false}).ops().size(), 2u);
  EXPECT_EQ(optimize(c, gpu_outputs, {.gpu = true}).ops().size(), 1u);
}

}  // namespace
}  // namespace kiln
