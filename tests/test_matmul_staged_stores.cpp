// The wgmma matmul kernel stores outputs whose rows start at odd elements (odd row strides: GPT-2's
// logits) through shared memory, a row a warp (StagedStores, cuda/lower/matmul.hpp), in the blocks
// wholly inside the output; edge blocks keep their checked stores. Each case runs in the SIMT
// simulator (which reports a shared read of a byte another thread wrote with no barrier between)
// against the Eigen executor, at every wgmma tiling.
#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/lower/util.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"
#include "ptxas_skip.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using testing::f32;

constexpr const char* kStaged = "interior tiles stored through shared memory a row a warp";
constexpr const char* kStagedChunks = "interior tiles stored through shared memory 16 bytes a store";

// The wgmma tilings the staged tiles are checked at (tile, stages).
constexpr std::pair<const char*, const char*> kTilings[] = {{"128x128", "3"}, {"128x256", "4"}, {"192x256", "4"}};

// x W^T + bias on bf16 operands; cast to bf16 where `bf16_out` (the matmul stores it as bf16).
testing::BuildFn linear(bool bf16_out) {
  return [bf16_out](Builder& bld, const std::vector<ValueId>& x) {
    ValueId y = bld.add(bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16), false, true), x[2]);
    return bf16_out ? bld.cast(y, DType::bf16) : y;
  };
}

struct StagedRun {
  std::string dump;
  int64_t bank_conflicts = 0;
};

// `build` over `inputs` after the GPU pipeline, on `rt`, against Eigen (1e-5: both sides multiply
// the same bf16 values); the program's dump and the matmul kernels' shared-memory bank conflicts
// (simulator only).
StagedRun run_against_eigen(cuda::Runtime& rt, const Target& target, const std::vector<testing::InputSpec>& inputs,
                            const testing::BuildFn& build) {
  testing::Harness h(inputs, build);
  std::vector<ValueId> outs{h.output};
  const Circuit optimized = optimize(h.circuit, outs, target);
  cuda::DeviceProgram dp(optimized, outs, rt, target);
  StagedRun r{dp.dump()};
  const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  const bool simulated = &rt == &testing::fake_runtime();
  if (simulated) cuda::fake_driver_count_bank_conflicts(true);
  const HostTensor got = dp.run(h.bindings)[0];
  if (simulated) {
    for (const auto& [name, s] : cuda::fake_driver_kernel_stats())
      if (name.find("matmul") != std::string::npos) r.bank_conflicts += s.bank_conflicts;
    cuda::fake_driver_count_bank_conflicts(false);
  }
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_LT(testing::relative_error(got, want), 1e-5) << r.dump;
  return r;
}

// x W^T + bias with 301 output columns (odd rows) over 260 rows: whole tiles and edge tiles in
// both directions at 128 and 192 rows, 128 and 256 columns; f32 out, and bf16 out (the sum cast
// to bf16: pairs of 16-bit elements, each row starting at an odd element). A batch of 2 whose
// items are 130 x 301 blocks apart (the rows folded: the staged rows run across items). And the
// same product with 304 columns, whose pairs go out as one store each: not staged.
void check_staged_stores(cuda::Runtime& rt) {
  for (const auto& [tile, stages] : kTilings) {
    SCOPED_TRACE(std::string(tile) + ", " + stages + " stages");
    const std::string tiling =
        std::string("bf16-mma=on,wgmma=on,split-k=0,staged-stores=odd,tile=") + tile + ",stages=" + stages;
    const Target target = testing::with_matmul(cuda::device_target(rt), tiling);
    for (const bool bf16_out : {false, true}) {
      SCOPED_TRACE(bf16_out ? "bf16 out" : "f32 out");
      const StagedRun r = run_against_eigen(rt, target, {f32({260, 64}), f32({301, 64}), f32({301})}, linear(bf16_out));
      EXPECT_NE(r.dump.find(kStaged), std::string::npos) << r.dump;
      EXPECT_EQ(r.bank_conflicts, 0) << r.dump;
      const StagedRun batched =
          run_against_eigen(rt, target, {f32({2, 130, 64}), f32({301, 64}), f32({301})}, linear(bf16_out));
      EXPECT_NE(batched.dump.find(kStaged), std::string::npos) << batched.dump;
    }
    const StagedRun even = run_against_eigen(rt, target, {f32({260, 64}), f32({304, 64}), f32({304})}, linear(false));
    EXPECT_EQ(even.dump.find("through shared memory"), std::string::npos) << even.dump;
    if (tile != std::string("192x256")) {  // K split 2 ways: the last block's epilogue, a loop, stores unstaged
      const StagedRun r = run_against_eigen(rt, testing::with_matmul(target, "split-k=2"),
                                            {f32({260, 192}), f32({301, 192}), f32({301})}, linear(false));
      EXPECT_NE(r.dump.find("K split 2 ways"), std::string::npos) << r.dump;
      EXPECT_EQ(r.dump.find("through shared memory"), std::string::npos) << r.dump;
    }
    for (const char* unstaged : {"staged-stores=none", ""}) {  // none, and the default (opt-in until timed on a GPU)
      Target t = testing::with_matmul(cuda::device_target(rt), std::string("bf16-mma=on,wgmma=on,split-k=0,tile=") +
                                                                   tile + ",stages=" + stages);
      if (*unstaged) t = testing::with_matmul(t, unstaged);
      const StagedRun r = run_against_eigen(rt, t, {f32({260, 64}), f32({301, 64}), f32({301})}, linear(false));
      EXPECT_EQ(r.dump.find("through shared memory"), std::string::npos) << r.dump;
    }
    // staged-stores=all: rows of 304 (whole 16-byte chunks in f32 and in bf16) copied out 16
    // bytes a store, batched too; odd rows as before.
    const Target all = testing::with_matmul(target, "staged-stores=all");
    for (const bool bf16_out : {false, true}) {
      SCOPED_TRACE(bf16_out ? "all, bf16 out" : "all, f32 out");
      const StagedRun r = run_against_eigen(rt, all, {f32({260, 64}), f32({304, 64}), f32({304})}, linear(bf16_out));
      EXPECT_NE(r.dump.find(kStagedChunks), std::string::npos) << r.dump;
      EXPECT_EQ(r.bank_conflicts, 0) << r.dump;
      const StagedRun batched =
          run_against_eigen(rt, all, {f32({2, 130, 64}), f32({2, 304, 64}), f32({304})}, linear(bf16_out));
      EXPECT_NE(batched.dump.find(kStagedChunks), std::string::npos) << batched.dump;
      const StagedRun odd = run_against_eigen(rt, all, {f32({260, 64}), f32({301, 64}), f32({301})}, linear(bf16_out));
      EXPECT_NE(odd.dump.find(kStaged), std::string::npos) << odd.dump;
    }
  }
}

TEST(Lowering, WgmmaStoresOddRowsThroughSharedMemory) { check_staged_stores(testing::fake_runtime()); }

// The staged kernels at each wgmma tiling, f32 and bf16 out, odd rows (and with
// staged-stores=all rows of whole chunks; 64-bit indices at 128x256), pass ptxas for
// sm_90a without spills.
TEST(Lowering, WgmmaStagedStoreKernelsPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const auto& [tile, stages] : kTilings)
    for (const bool chunks : {false, true})
      for (const bool bf16_out : {false, true})
        for (const bool wide_indices : {false, true}) {
          if (wide_indices && tile != std::string("128x256")) continue;
          Target target = testing::with_matmul(cuda::device_target(testing::fake_runtime()),
                                               std::string("bf16-mma=on,wgmma=on,split-k=0,tile=") + tile +
                                                   ",stages=" + stages + ",staged-stores=" + (chunks ? "all" : "odd"));
          target.wide_indices = wide_indices;
          const int64_t n = chunks ? 304 : 301;
          testing::Harness h({f32({260, 64}), f32({n, 64}), f32({n})}, linear(bf16_out));
          std::vector<ValueId> outs{h.output};
          const Circuit optimized = optimize(h.circuit, outs, target);
          cuda::DeviceProgram dp(optimized, outs, testing::fake_runtime(), target);
          ASSERT_NE(dp.dump().find(chunks ? kStagedChunks : kStaged), std::string::npos) << dp.dump();
          for (const auto& kl : dp.kernels()) {
            const kir::Kernel& k = *kl.launch->kernel;
            if (k.name.find("matmul") == std::string::npos) continue;
            const cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(k, 90), 90);
            EXPECT_TRUE(r.ok) << k.name << ": " << r.log;
            EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << k.name << ": " << r.log;
            std::printf("staged %s, %s, %s out, %s indices: %d registers\n", tile, chunks ? "16-byte" : "odd rows",
                        bf16_out ? "bf16" : "f32", wide_indices ? "u64" : "u32", r.registers);
          }
        }
}

TEST(Lowering, GpuWgmmaStoresOddRowsThroughSharedMemory) {
  KILN_GPU_OR_SKIP(rt);
  if (rt->sm() != 90) GTEST_SKIP() << "wgmma needs sm_90a; this GPU is sm_" << rt->sm();
  check_staged_stores(*rt);
}

}  // namespace
}  // namespace kiln
