// kiln's settings (circuit/ir/settings.hpp), the Target's parsed choices (circuit/ir/target.hpp)
// and the pass pipeline's switches (circuit/passes/pipeline.hpp): malformed values and unknown
// names are reported, not ignored, and a variable kiln no longer reads is named with its option.
#include <gtest/gtest.h>

#include <algorithm>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/circuit/ir/target.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/onednn_matmul.hpp>

#include "scoped_env.hpp"

namespace kiln {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The message of the kiln::Error that `f` throws, or "" when it throws none.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Settings, AMisspeltKilnVariableIsReportedAndKnownOnesAreNot) {
  testing::ScopedEnv typo("KILN_NUM_THRAEDS", "1");
  testing::ScopedEnv known("KILN_PROFILE", "5");
  testing::ScopedEnv script("KILN_CHECK_LIMIT_GPT2", "900");  // gpu-check's KILN_CHECK_* family
  const std::vector<std::string> unknown = unknown_variables();
  EXPECT_TRUE(contains(unknown, "KILN_NUM_THRAEDS"));
  EXPECT_FALSE(contains(unknown, "KILN_PROFILE"));
  EXPECT_FALSE(contains(unknown, "KILN_CHECK_LIMIT_GPT2"));
}

TEST(Settings, AMalformedThreadCountNamesTheVariableAndTheRange) {
  for (const char* bad : {"zero", "0", "4097", "2x"}) {
    testing::ScopedEnv threads("KILN_NUM_THREADS", bad);
    EXPECT_NE(error_of([] { settings(); }).find("KILN_NUM_THREADS: expected a thread count from 1 to 4096"),
              std::string::npos)
        << bad;
  }
  testing::ScopedEnv threads("KILN_NUM_THREADS", "3");
  EXPECT_EQ(settings().num_threads, 3);
}

// A removed tuning variable still set is not unknown: it gets a warning naming the option that
// replaced it (and it changes nothing).
TEST(Settings, ARemovedVariableNamesTheOptionThatReplacedIt) {
  testing::ScopedEnv tile("KILN_MMA_TILE", "128x256"), fake("KILN_FAKE_CUDA", "1");
  EXPECT_FALSE(contains(unknown_variables(), "KILN_MMA_TILE"));
  const std::vector<std::string> warnings = removed_variable_warnings();
  auto warned = [&](const std::string& text) {
    return std::any_of(warnings.begin(), warnings.end(), [&](const std::string& w) { return w.find(text) == 0; });
  };
  EXPECT_TRUE(warned("KILN_MMA_TILE is no longer read: use --matmul tile=")) << ::testing::PrintToString(warnings);
  EXPECT_TRUE(warned("KILN_FAKE_CUDA is no longer read: use --device sim")) << ::testing::PrintToString(warnings);
  EXPECT_EQ(cpu_target().matmul, MatmulPolicy{});
}

// --matmul KEY=VALUE,...: each key into the policy, the rest left as it was; a bad key or value
// is an error naming the key and what it takes. The policy prints back in the same syntax.
TEST(TargetOptions, MatmulPolicyParsesValidatesAndPrintsBack) {
  const MatmulPolicy p = parse_matmul_policy("tile=192x256,stages=4,split-k=auto,wgmma=on,staged-stores=all");
  EXPECT_EQ(p.tile_m, 192);
  EXPECT_EQ(p.tile_n, 256);
  EXPECT_EQ(p.stages, 4);
  EXPECT_EQ(p.split_k, -1);
  EXPECT_EQ(p.wgmma, true);
  EXPECT_EQ(p.staged_stores, MmaStaging::all);
  EXPECT_EQ(parse_matmul_policy(matmul_policy_str(p)), p);
  const MatmulPolicy q = parse_matmul_policy("simt-tile=64,bf16-mma=off,products-first=on,tensor-copies=on", p);
  EXPECT_EQ(q.tile_n, 256);  // kept from p
  EXPECT_EQ(q.simt_tile, 64);
  EXPECT_FALSE(q.bf16_mma);
  EXPECT_TRUE(q.products_first && q.tensor_copies);
  EXPECT_EQ(parse_matmul_policy(matmul_policy_str(q)), q);
  EXPECT_EQ(matmul_policy_str(MatmulPolicy{}), "");
  EXPECT_NE(error_of([] { parse_matmul_policy("tile=100x100"); }).find("--matmul tile: expected 128x128"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_matmul_policy("stages=5"); }).find("--matmul stages: expected 2, 3 or 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_matmul_policy("wgmma=1"); }).find("--matmul wgmma: expected on or off, received '1'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_matmul_policy("tiles=128x128"); }).find("--matmul: unknown key 'tiles'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_matmul_policy("tile"); }).find("expected KEY=VALUE"), std::string::npos);
  EXPECT_NE(error_of([] { parse_attention_path("ffma"); }).find("--attention-path: expected mma or simt"),
            std::string::npos);
}

// oneDNN's bf16 products are the CPU default only where they were timed faster: AMX-BF16 (not
// AVX512-BF16 alone, untimed), and only in a build with oneDNN.
TEST(TargetOptions, CpuBf16ProductsDefaultToOneDnnWithAmxOnly) {
  CpuFeatures amx;
  amx.avx2 = amx.fma = amx.avx512f = amx.avx512_bf16 = amx.amx_bf16 = true;
  CpuFeatures avx512_bf16 = amx;
  avx512_bf16.amx_bf16 = false;
  EXPECT_EQ(default_cpu_bf16(amx, true), CpuBf16Products::onednn);
  EXPECT_EQ(default_cpu_bf16(amx, false), CpuBf16Products::rounded_f32);
  EXPECT_EQ(default_cpu_bf16(avx512_bf16, true), CpuBf16Products::rounded_f32);
  EXPECT_EQ(default_cpu_bf16(CpuFeatures{}, true), CpuBf16Products::rounded_f32);
  // A build with oneDNN has its f32 matmul everywhere.
  EXPECT_EQ(cpu_target().cpu_bf16, default_cpu_bf16(cpu_target().cpu, OneDnnMatmul::available(DType::f32)));
}

// The device decides wgmma where the policy does not: a real sm_90 GPU takes it, the fake driver
// (which reports sm_90) and sm_80 do not; the policy decides either way.
TEST(TargetOptions, WgmmaIsTheDefaultOfARealSm90Only) {
  EXPECT_TRUE(cuda_target(90, false).wgmma());
  EXPECT_FALSE(cuda_target(90, true).wgmma());
  EXPECT_FALSE(cuda_target(80, false).wgmma());
  Target off = cuda_target(90, false), on = cuda_target(80, false);
  off.matmul.wgmma = false;
  on.matmul.wgmma = true;
  EXPECT_FALSE(off.wgmma());
  EXPECT_TRUE(on.wgmma());
  EXPECT_NE(on.str().find("cuda sm_80 wgmma"), std::string::npos) << on.str();
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
  EXPECT_EQ(optimize(c, fused_outputs, cpu_target()).ops().size(), 1u);
  EXPECT_EQ(optimize(c, outputs, cpu_target(), parse_pipeline_options("-cse,-fuse_pointwise,-fuse_rows")).ops().size(),
            2u);
}

TEST(Pipeline, AnUnknownPassNameIsAnErrorListingTheKnownOnes) {
  std::vector<ValueId> outputs;
  Circuit c = chain(outputs);
  PipelineOptions misspelt;  // past the parser: optimize checks the names too
  misspelt.disabled = {"fuse_pointwse"};
  for (const std::string& what : {error_of([] { parse_pipeline_options("-fuse_pointwse"); }),
                                  error_of([&] { optimize(c, outputs, cpu_target(), misspelt); })}) {
    EXPECT_NE(what.find("--passes: no pass is named 'fuse_pointwse'"), std::string::npos) << what;
    for (const PassInfo& p : pipeline_passes()) EXPECT_NE(what.find(p.name), std::string::npos) << what;
  }
  EXPECT_NE(error_of([] { parse_pipeline_options("fuse_rows"); }).find("with a leading '-'"), std::string::npos);
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
  EXPECT_EQ(optimize(c, cpu_outputs, cpu_target()).ops().size(), 2u);
  EXPECT_EQ(optimize(c, gpu_outputs, cuda_target(90, /*fake=*/true)).ops().size(), 1u);
}

}  // namespace
}  // namespace kiln
