// The f32 FFMA matmul kernel's operands stored along their rows (b of x W with W stored [k][n],
// both of a weight gradient's X^T dY) are copied into its tiles by cp.async, 16 bytes a copy,
// where their 4-row chunks are 16-byte aligned and they take no prologue (TileLoader::async,
// cuda/lower/matmul_tiles.hpp); the other operands keep the register-staged loads. Each case
// counts the kernel's copies and runs in the SIMT simulator (which reports a tile read before its
// copies' wait group completes) against the Eigen executor.
#include <gtest/gtest.h>

#include <string>

#include "circuit/exec/executor.hpp"
#include "circuit/passes/pipeline.hpp"
#include "cuda/kir/ptx_printer.hpp"
#include "cuda/lower/fused_matmul.hpp"
#include "cuda/runtime/device_program.hpp"
#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

using testing::f32;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Runs `build` over inputs of `shapes` in the simulator against Eigen (f32: 1e-5) and returns the
// cp.async copies its one FFMA matmul kernel issues (in PTX: per operand copied, its chunks a
// thread, at the prologue's fetch and at each half of the loop unrolled by two).
size_t async_copies(const std::vector<Shape>& shapes, const testing::BuildFn& build) {
  std::vector<testing::InputSpec> specs;
  for (const Shape& s : shapes) specs.push_back(f32(s));
  testing::Harness h(specs, build);
  std::vector<ValueId> outs{h.output};
  const Circuit optimized = optimize(h.circuit, outs, {.gpu = true});  // slices and prologues into the views
  cuda::DeviceProgram dp(optimized, outs, testing::fake_runtime());
  size_t copies = 0, matmuls = 0;
  for (const auto& kl : dp.kernels()) {
    const kir::Kernel& kernel = *kl.launch->kernel;
    if (kernel.name.find("matmul") == std::string::npos) continue;
    ++matmuls;
    copies += count(kir::print_ptx(kernel, 90), "cp.async.cg.shared.global");
  }
  EXPECT_EQ(matmuls, 1u) << dp.dump();
  const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5);
  return copies;
}

ValueId product(Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1]); }
ValueId product_ta(Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], x[1], true, false); }

// x W with W stored [k][n]: b is copied, a (k contiguous) is not. Edges of rows (70, 136 in
// 128-row tiles), K of 0, 8 (one partial step), 40 and 48; 64x64 tiles take a chunk a thread,
// 128x128 two. A weight gradient's X^T dY (72 rows of X) copies both. Batched: each item's
// offsets.
TEST(Lowering, FfmaTilesCopyOperandsStoredAlongTheirRowsByCpAsync) {
  for (const int tile : {64, 128}) {
    SCOPED_TRACE(tile);
    cuda::ForceMatmulTile forced(tile);
    const size_t per_operand = tile == 128 ? 6 : 3;  // 3 fetches of 2 or 1 chunks
    for (const int64_t k : {0, 8, 40, 48}) {
      SCOPED_TRACE(k);
      EXPECT_EQ(async_copies({{70, k}, {k, 136}}, product), per_operand);
    }
    EXPECT_EQ(async_copies({{40, 72}, {40, 136}}, product_ta), 2 * per_operand);
    EXPECT_EQ(async_copies({{3, 70, 40}, {3, 40, 136}}, product), per_operand);
  }
}

// A view of fewer rows than its k stride (a slice of W's columns, folded into the operand's view)
// ends in a chunk of 2 rows: the copy reads those 8 bytes and zero-fills the rest.
TEST(Lowering, FfmaAsyncTilesZeroFillAPartialChunk) {
  cuda::ForceMatmulTile forced(128);
  EXPECT_EQ(
      async_copies({{70, 40}, {40, 128}},
                   [](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], b.slice(x[1], 1, 0, 126)); }),
      6u);
}

// Operands the copies cannot take keep the register-staged loads: rows not 16-byte chunks (n =
// 138), a prologue (exp(W)), and bf16 operands (widened to f32 as they are stored).
TEST(Lowering, FfmaTilesStageOtherOperandsThroughRegisters) {
  cuda::ForceMatmulTile forced(128);
  cuda::ForceBf16Mma widened(false);
  EXPECT_EQ(async_copies({{70, 40}, {40, 138}}, product), 0u);
  EXPECT_EQ(async_copies({{70, 40}, {40, 136}},
                         [](Builder& b, const std::vector<ValueId>& x) {
                           return b.matmul(x[0], b.pointwise(se::exp(se::in(0)), {x[1]}));
                         }),
            0u);
  EXPECT_EQ(async_copies({{70, 40}, {40, 136}},
                         [](Builder& b, const std::vector<ValueId>& x) {
                           return b.matmul(b.cast(x[0], DType::bf16), b.cast(x[1], DType::bf16));
                         }),
            0u);
}

}  // namespace
}  // namespace kiln
