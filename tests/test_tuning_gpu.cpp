// The GPU side of the autotuner on the fake driver: every matmul candidate it may pick, on
// mma.sync and on wgmma, is lowered with its choice, run in the SIMT simulator and checked
// against Eigen by the tuner itself; the injected clock decides the winner (the fake driver never
// times); every candidate's matmul kernels pass ptxas.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/tuning.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"
#include "ptxas_skip.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using testing::f32;

// x [130, 64] W[96, 64]^T + b in bf16 products (f32 out); or the same in f32.
testing::BuildFn linear(bool bf16) {
  return [bf16](Builder& bld, const std::vector<ValueId>& x) {
    const ValueId a = bf16 ? bld.cast(x[0], DType::bf16) : x[0], w = bf16 ? bld.cast(x[1], DType::bf16) : x[1];
    return bld.add(bld.matmul(a, w, false, true), x[2]);
  };
}

struct Case {
  const char* name;
  const char* matmul;  // the Target's --matmul
  bool bf16;
  size_t candidates;   // gpu_candidates of its matmul kernel
};

constexpr Case kCases[] = {{"bf16 on mma.sync", "wgmma=off", true, 6},
                           {"bf16 on wgmma", "wgmma=on", true, 13},
                           {"f32 on FFMA", "", false, 3}};

// A case's plan, its matmul kernel and that kernel's candidates.
struct Plan {
  Target target;
  testing::Harness h;
  std::vector<ValueId> outs;
  Circuit optimized;
  std::string kernel;
  std::vector<KernelChoice> candidates;
  explicit Plan(const Case& c)
      : target(testing::with_matmul(cuda::device_target(testing::fake_runtime()), c.matmul)),
        h({f32({130, 64}), f32({96, 64}), f32({96})}, linear(c.bf16)),
        outs{h.output},
        optimized(optimize(h.circuit, outs, target)) {
    for (const Op& op : optimized.ops())
      if (op.is(PrimId::matmul) || op.is(PrimId::fused_matmul)) {
        kernel = kernel_signature(optimized, op);
        candidates = gpu_candidates(optimized, op, target);
      }
  }
};

TEST(TuningGpu, EveryMatmulCandidateMatchesEigenInTheSimulatorAndTheClockDecides) {
  cuda::Runtime& rt = testing::fake_runtime();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Plan p(c);
    ASSERT_EQ(p.candidates.size(), c.candidates) << p.optimized.dump();
    TuneOptions options;
    options.runtime = &rt;
    EXPECT_THROW(tune_kernels(p.optimized, p.target, options), Error);  // the fake driver never times
    options.gpu_rounds = 1;
    const KernelChoice winner = p.candidates.back();
    options.clock = [&](const std::string&, const KernelChoice& choice, double) { return choice == winner ? 1.0 : 2.0; };
    const TuneReport report = tune_kernels(p.optimized, p.target, options);
    ASSERT_EQ(report.kernels.size(), 1u);
    const KernelResult& r = report.kernels[0];
    EXPECT_EQ(r.kernel, p.kernel);
    ASSERT_EQ(r.candidates.size(), p.candidates.size());
    for (const CandidateResult& cand : r.candidates) EXPECT_EQ(cand.failure, "") << cand.choice.str();
    EXPECT_EQ(r.chosen, winner);
    EXPECT_EQ(tuning_entries(report)[0].choice, winner);
  }
}

// Each candidate's matmul kernels pass ptxas without spills, and the choices reach the PTX.
TEST(TuningGpu, EveryMatmulCandidatePassesPtxas) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Plan p(c);
    std::set<std::string> ptx;
    for (const KernelChoice& choice : p.candidates) {
      Target t = p.target;
      t.tuned = KernelChoices({{p.kernel, choice}});
      cuda::DeviceProgram dp(p.optimized, p.outs, testing::fake_runtime(), t);
      for (const auto& kl : dp.kernels()) {
        const kir::Kernel& k = *kl.launch->kernel;
        if (k.name.find("matmul") == std::string::npos) continue;
        const std::string text = kir::print_ptx(k, 90);
        ptx.insert(text);
        const cuda::PtxasResult r = cuda::run_ptxas(text, 90);
        EXPECT_TRUE(r.ok) << choice.str() << ": " << r.log;
        EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << choice.str() << ": " << r.log;
      }
    }
    EXPECT_GE(ptx.size(), c.bf16 ? 4u : 2u);
  }
}

TEST(TuningGpu, MatmulKeysOfAChoiceAreValidated) {
  KernelChoice k;
  k.matmul = "tile=128x256+stages=3";
  EXPECT_EQ(KernelChoice::parse(k.str()), k);
  EXPECT_EQ(k.matmul_policy(MatmulPolicy{}).tile_n, 256);
  EXPECT_EQ(k.matmul_policy(MatmulPolicy{}).stages, 3);
  EXPECT_THROW(KernelChoice::parse("matmul=tile=100x100"), Error);
}

}  // namespace
}  // namespace kiln
