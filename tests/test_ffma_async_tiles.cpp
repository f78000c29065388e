// The f32 FFMA matmul kernel's operands stored along their rows (b of x W with W stored [k][n],
// both of a weight gradient's X^T dY) are copied into its tiles by cp.async, 16 bytes a copy,
// where their 4-row chunks are 16-byte aligned and they take no prologue (TileLoader::async,
// cuda/lower/matmul.hpp); the other operands keep the register-staged loads. Each case
// counts the kernel's copies and runs in the SIMT simulator (which reports a tile read before its
// copies' wait group completes) against the Eigen executor.
#include <gtest/gtest.h>

#include <string>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using testing::f32;

struct MatmulKernel {
  size_t copies = 0;             // cp.async copies in its PTX
  bool asks_two_blocks = false;  // .minnctapersm 2
};

// Runs `build` over `inputs` after the GPU pipeline (slices and prologues folded into the
// matmul's views) in the simulator against Eigen (1e-5) and describes its one matmul kernel: the
// copies it issues (per operand copied, its chunks a thread, at the prologue's fetch and at each
// half of the loop unrolled by two).
MatmulKernel matmul_kernel(const std::vector<testing::InputSpec>& inputs, const testing::BuildFn& build,
                           const Target& target) {
  testing::Harness h(inputs, build);
  std::vector<ValueId> outs{h.output};
  const Circuit optimized = optimize(h.circuit, outs, target);
  cuda::DeviceProgram dp(optimized, outs, testing::fake_runtime(), target);
  MatmulKernel r;
  size_t matmuls = 0;
  for (const auto& kl : dp.kernels()) {
    const kir::Kernel& kernel = *kl.launch->kernel;
    if (kernel.name.find("matmul") == std::string::npos) continue;
    ++matmuls;
    const std::string ptx = kir::print_ptx(kernel, 90);
    r.copies += testing::occurrences(ptx, "cp.async.cg.shared.global");
    r.asks_two_blocks = ptx.find(".minnctapersm 2") != std::string::npos;
  }
  EXPECT_EQ(matmuls, 1u) << dp.dump();
  const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
  EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5);
  return r;
}

size_t async_copies(const std::vector<Shape>& shapes, const testing::BuildFn& build, const Target& target) {
  std::vector<testing::InputSpec> specs;
  for (const Shape& s : shapes) specs.push_back(f32(s));
  return matmul_kernel(specs, build, target).copies;
}

// The fake device's Target with the FFMA kernel's tiles forced to `size`.
Target ffma_tiles(int size) {
  return testing::with_matmul(cuda::device_target(testing::fake_runtime()), "simt-tile=" + std::to_string(size));
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
    const Target forced = ffma_tiles(tile);
    const size_t per_operand = tile == 128 ? 6 : 3;  // 3 fetches of 2 or 1 chunks
    for (const int64_t k : {0, 8, 40, 48}) {
      SCOPED_TRACE(k);
      EXPECT_EQ(async_copies({{70, k}, {k, 136}}, product, forced), per_operand);
    }
    EXPECT_EQ(async_copies({{40, 72}, {40, 136}}, product_ta, forced), 2 * per_operand);
    EXPECT_EQ(async_copies({{3, 70, 40}, {3, 40, 136}}, product, forced), per_operand);
  }
}

// A view of fewer rows than its k stride (a slice of W's columns, folded into the operand's
// view) ends in a chunk of 2 rows, whose 8 bytes are copied. (Bytes past them would only feed
// output columns that are never stored: this checks the rows copied, not the zero fill.)
TEST(Lowering, FfmaAsyncTilesCopyThePartialChunkOfAView) {
  const Target forced = ffma_tiles(128);
  EXPECT_EQ(
      async_copies(
          {{70, 40}, {40, 128}},
          [](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], b.slice(x[1], 1, 0, 126)); }, forced),
      6u);
}

// Row sums of a copied a (a weight gradient's dY^T X with its bias gradient, K = 70: the sums
// read the copied tiles, zero past K) against Eigen. Row sums keep the kernel from asking for two
// blocks an SM (they cost registers).
TEST(Lowering, FfmaAsyncTilesFeedTheRowSumsOfA) {
  const Target forced = ffma_tiles(128);
  const MatmulKernel k = matmul_kernel(
      {f32({70, 72}), f32({70, 136})},
      [](Builder& b, const std::vector<ValueId>& x) {
        FusedMatmul f = FusedMatmul::plain(Shape{70, 72}, Shape{70, 136}, true, false);
        f.a_row_sums = true;
        f.row_sums_shape = Shape{72};
        std::vector<ValueId> outs = b.circuit().add_op("fused_matmul", f.to_params(DType::f32), x, b.scope());
        return b.concat({b.reshape(outs[0], Shape{72 * 136}), outs[1]}, 0);
      },
      forced);
  EXPECT_EQ(k.copies, 12u);
  EXPECT_FALSE(k.asks_two_blocks);
}

// Operands the copies cannot take keep the register-staged loads: rows not 16-byte chunks (n =
// 138), a view starting 2 floats into its rows (a slice from column 2), a prologue (exp(W), which
// also keeps the kernel from asking for two blocks an SM), and operands stored as bf16 (64x64
// FFMA tiles, with the bf16 mma kernel off: widened to f32 as they are stored).
TEST(Lowering, FfmaTilesStageOtherOperandsThroughRegisters) {
  const Target forced = ffma_tiles(128);
  const MatmulKernel plain = matmul_kernel({f32({70, 40}), f32({40, 136})}, product, forced);
  EXPECT_TRUE(plain.asks_two_blocks);
  EXPECT_EQ(async_copies({{70, 40}, {40, 138}}, product, forced), 0u);
  EXPECT_EQ(
      async_copies(
          {{70, 40}, {40, 132}},
          [](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], b.slice(x[1], 1, 2, 130)); }, forced),
      0u);
  const MatmulKernel prologue = matmul_kernel(
      {f32({70, 40}), f32({40, 136})},
      [](Builder& b, const std::vector<ValueId>& x) { return b.matmul(x[0], b.pointwise(se::exp(se::in(0)), {x[1]})); },
      forced);
  EXPECT_EQ(prologue.copies, 0u);
  EXPECT_FALSE(prologue.asks_two_blocks);
  const Target widened = testing::with_matmul(ffma_tiles(64), "bf16-mma=off");
  const testing::InputSpec x{Shape{70, 40}, DType::bf16, -2, 2}, w{Shape{40, 136}, DType::bf16, -2, 2};
  EXPECT_EQ(matmul_kernel({x, w}, product, widened).copies, 0u);
}

}  // namespace
}  // namespace kiln
