// matmul_column_sums (circuit/passes/matmul_column_sums.hpp) and FusedMatmul::block_sums: a
// bias gradient (the column sums of an epilogue, dY = (x w) * gelu_grad(pre)) that a matmul also
// reads (as bf16) becomes 128-row block sums the matmul kernel writes, the f32 epilogue no longer
// stored. The optimized circuit against the recorded one on the Eigen executor (the block sums'
// reference) and in the simulator, over 300 rows (two whole blocks and a partial one; or a batch
// of 2 x 150) or 128, and 200 columns (a partial column tile), on each kernel the product can
// take: bf16 mma.sync in both tilings, wgmma in both, split-K on either (the last block's
// epilogue); f32 on the FFMA tiles and on both tf32 kernels, against an f64 sum of each block.
// The sums' order differs from the column sums': f32 tolerances. Every kernel passes ptxas. An
// epilogue that is its op's only one is kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using Case = testing::CircuitCase;

// dy = (x w) * gelu_grad(pre) over (rows, 200), or (2, rows / 2, 200) with `batched` (the
// matmul's batch: z); outputs: dy's column sums (over dy seen as rows of 200, as a linear
// layer's bias gradient is recorded), and dy w2 (bf16 operands when `bf16`, f32 otherwise).
Case bias_gradient(int64_t rows, int64_t k, bool bf16, bool batched = false, int64_t n = 200) {
  Case c;
  Circuit& g = c.circuit;
  const Shape lead = batched ? Shape{2, rows / 2} : Shape{rows};
  auto with_last = [&](int64_t n) {
    std::vector<int64_t> d = lead.dims();
    d.push_back(n);
    return Shape(d);
  };
  const ValueId x = g.add_external({with_last(k), DType::f32}, ValueRole::Input, "x");
  const ValueId w = g.add_external({Shape{k, n}, DType::f32}, ValueRole::Input, "w");
  const ValueId pre = g.add_external({with_last(n), DType::f32}, ValueRole::Input, "pre");
  const ValueId w2 = g.add_external({Shape{n, 24}, DType::f32}, ValueRole::Input, "w2");
  Builder b(g, "test");
  auto operand = [&](ValueId v) { return bf16 ? b.cast(v, DType::bf16) : v; };
  const ValueId dy = b.pointwise(se::in(0) * se::gelu_grad(se::in(1)), {b.matmul(operand(x), operand(w)), pre});
  c.outputs = {b.reduce(ReduceKind::Sum, batched ? b.reshape(dy, Shape{rows, n}) : dy, 0),
               b.matmul(operand(dy), operand(w2))};
  for (const ValueId v : {x, w, pre, w2})
    c.bindings.push_back(testing::random_tensor({g.info(v).shape, DType::f32}, 40 + static_cast<uint64_t>(v)));
  return c;
}

// The fused_matmul ops of c with block sums, and the outputs of all of them.
std::pair<size_t, size_t> block_summing(const Circuit& c) {
  size_t ops = 0, outputs = 0;
  for (const Op& op : c.ops())
    if (op.is(PrimId::fused_matmul) && FusedMatmul::from_params(op.params).block_sums) {
      ++ops;
      outputs += op.outputs.size();
    }
  return {ops, outputs};
}

TEST(MatmulColumnSums, ABiasGradientIsSummedByTheMatmulThatMakesIt) {
  struct Setting {
    const char* name;
    bool bf16;
    int64_t rows, k;
    const char *tile, *wgmma, *split, *kernel;
    bool batched = false;
  };
  const Setting settings[] = {
      {"bf16 mma.sync 128x128", true, 300, 64, "128x128", "off", "0", "mma.sync bf16"},
      {"bf16 mma.sync 128x256", true, 128, 64, "128x256", "off", "0", "mma.sync bf16"},
      {"bf16 mma.sync, batch 2 x 150 rows", true, 300, 64, "128x128", "off", "0", "mma.sync bf16", true},
      {"bf16 wgmma 128x256", true, 300, 64, "128x256", "on", "0", "wgmma m64n256"},
      {"bf16 wgmma 128x128", true, 300, 64, "128x128", "on", "0", "wgmma m64n128"},
      // 192x256 asked for: the summing product keeps 128-row tiles (its sums are of 128-row blocks).
      {"bf16 wgmma 192x256 asked for", true, 300, 64, "192x256", "on", "0", "tile 128x256x64, 256 threads"},
      {"bf16 wgmma split 2", true, 300, 256, "128x128", "on", "2", "K split 2 ways"},
      {"bf16 mma.sync split 2", true, 300, 256, "128x128", "off", "2", "K split 2 ways"},
  };
  for (const Setting& s : settings) {
    SCOPED_TRACE(s.name);
    const Target target = testing::with_matmul(
        cuda_target(90, /*fake=*/true), std::string("tile=") + s.tile + ",wgmma=" + s.wgmma + ",split-k=" + s.split);
    Case k = bias_gradient(s.rows, s.k, s.bf16, s.batched);
    // The reference sums exact bf16 products in f32, as the GPU's kernels do (oneDNN's bf16
    // kernels, the CPU default with AMX-BF16, sum in another order, and dy's rounding to bf16
    // then differs by an ulp here and there).
    Target reference = cpu_target();
    reference.cpu_bf16 = CpuBf16Products::rounded_f32;
    const std::vector<HostTensor> want = Program(k.circuit, k.outputs, reference).run(k.bindings);
    std::vector<ValueId> outs = k.outputs;
    const Circuit planned = optimize(k.circuit, outs, target);
    // One matmul sums; its f32 epilogue is gone (bf16: the copy and the sums; f32: dy, which the
    // second product reads, and the sums).
    EXPECT_EQ(block_summing(planned), std::make_pair(size_t{1}, size_t{2})) << planned.dump("planned");
    const std::vector<HostTensor> cpu = execute(planned, k.bindings, outs);
    cuda::DeviceProgram dp(planned, outs, testing::fake_runtime(), target);
    EXPECT_NE(dp.dump().find(s.kernel), std::string::npos) << dp.dump();
    std::vector<const kir::Kernel*> kernels;
    for (const auto& kl : dp.kernels()) kernels.push_back(kl.launch->kernel.get());
    testing::expect_ptxas_accepts(kernels);
    const std::vector<HostTensor> dev = dp.run(k.bindings);
    for (size_t o = 0; o < want.size(); ++o) {
      EXPECT_LT(testing::relative_error(cpu[o], want[o]), 1e-5) << "output " << o << " (Eigen)";
      EXPECT_LT(testing::relative_error(dev[o], want[o]), 1e-5) << "output " << o << " (simulator)";
    }
  }
}

// tile=waves on wgmma would take 192x256 tiles for 8192 x 768 outputs (one wave of 129
// blocks), but a summing product keeps 128-row tiles: here 128x128 (three waves of 384 blocks
// against two of 192 at 128x256: 3 < 3.2). Lowered only (8192 rows are slow to simulate).
TEST(MatmulColumnSums, WavesKeepTheSummingProductOn128RowTiles) {
  const Target target = testing::with_matmul(cuda_target(90, /*fake=*/true), "tile=waves,wgmma=on");
  Case k = bias_gradient(8192, 64, true, false, 768);
  std::vector<ValueId> outs = k.outputs;
  const Circuit planned = optimize(k.circuit, outs, target);
  ASSERT_EQ(block_summing(planned).first, 1u) << planned.dump("planned");
  cuda::DeviceProgram dp(planned, outs, testing::fake_runtime(), target);
  const std::string d = dp.dump();
  size_t summing = 0;
  for (size_t at = d.find("block sums"); at != std::string::npos; at = d.find("block sums", at + 1)) {
    const size_t line = d.rfind('\n', at) + 1;
    const std::string text = d.substr(line, d.find('\n', at) - line);
    if (text.find("fused_matmul:") == std::string::npos) continue;
    ++summing;
    EXPECT_NE(text.find("tile 128x128x64"), std::string::npos) << text;
  }
  EXPECT_EQ(summing, 1u) << d;
}

// The f32 kernels' block sums (an f32 step sums its bias gradients as row sums of the weight
// gradient's operand instead; these ops are built directly): the FFMA tiles (128x128 taken for
// block sums whatever the grid: 64x64 otherwise here), the tf32 cp.async kernel, and the tf32
// kernel that stages tiles through registers (an operand with a prologue), with and without the
// summed epilogue also stored.
TEST(MatmulColumnSums, BlockSumsOnTheF32Kernels) {
  for (const char* tf32 : {"0", "1", "prologue"})
    for (const bool stored : {false, true}) {
      SCOPED_TRACE(std::string("tf32 ") + tf32 + (stored ? ", the epilogue stored too" : ""));
      const bool prologue = tf32 == std::string("prologue");
      Target target = cuda::device_target(testing::fake_runtime());
      target.tf32 = prologue || tf32 == std::string("1");
      Circuit c;
      const ValueId x = c.add_external({Shape{300, 64}, DType::f32}, ValueRole::Input, "x");
      const ValueId w = c.add_external({Shape{64, 200}, DType::f32}, ValueRole::Input, "w");
      const ValueId pre = c.add_external({Shape{300, 200}, DType::f32}, ValueRole::Input, "pre");
      FusedMatmul f = FusedMatmul::plain(Shape{300, 64}, Shape{64, 200}, false, false);
      f.extras = 1;
      f.block_sums = true;
      f.block_sums_body = se::in(0) * se::gelu_grad(se::in(1));
      f.epilogues = {stored ? f.block_sums_body : se::in(0) + se::in(1)};
      if (prologue) f.a.prologue = se::in(0) * se::c(0.5);
      const std::vector<ValueId> outs = c.add_op(PrimId::fused_matmul, f.to_params(DType::f32), {x, w, pre});
      std::vector<HostTensor> bindings;
      for (const ValueId v : {x, w, pre})
        bindings.push_back(testing::random_tensor({c.info(v).shape, DType::f32}, 20 + static_cast<uint64_t>(v)));
      const std::vector<HostTensor> cpu = execute(c, bindings, outs);
      cuda::DeviceProgram dp(c, outs, testing::fake_runtime(), target);
      const char* kernel = prologue                   ? "mma.sync tf32 on warp tiles"
                           : tf32 == std::string("1") ? "fragments rounded to tf32"
                                                      : "tile 128x128x16, 256 threads x 8x8";
      EXPECT_NE(dp.dump().find(kernel), std::string::npos) << dp.dump();
      std::vector<const kir::Kernel*> kernels;
      for (const auto& kl : dp.kernels()) kernels.push_back(kl.launch->kernel.get());
      testing::expect_ptxas_accepts(kernels);
      const std::vector<HostTensor> dev = dp.run(bindings);
      const double tolerance = tf32 == std::string("0") ? 1e-5 : 1e-3;  // tf32's operand rounding
      for (size_t o = 0; o < cpu.size(); ++o) EXPECT_LT(testing::relative_error(dev[o], cpu[o]), tolerance) << o;
      // The reference's block sums: each 128-row block's column sums of the body, from f64.
      double worst = 0;
      for (int64_t j = 0; j < 200; j += 37)
        for (int64_t blk = 0; blk < 3; ++blk) {
          double sum = 0, magnitude = 0;
          for (int64_t r = 128 * blk; r < std::min<int64_t>(300, 128 * (blk + 1)); ++r) {
            double acc = 0;
            for (int64_t k = 0; k < 64; ++k)
              acc += bindings[0].get(r * 64 + k) * (prologue ? 0.5 : 1.0) * bindings[1].get(k * 200 + j);
            const double v = acc * se::gelu_grad(se::in(0)).eval(std::vector<double>{bindings[2].get(r * 200 + j)});
            sum += v;
            magnitude += std::abs(v);
          }
          worst = std::max(worst, std::abs(cpu[1].get(blk * 200 + j) - sum) / magnitude);
        }
      EXPECT_LT(worst, 1e-5);
    }
}

// The summed epilogue as the matmul's only one (a product's column sums and nothing else: the
// bias gradient of a layer whose dY a matmul makes and nothing else reads): it stays (an op has
// one epilogue at least), and the sums are the matmul's.
TEST(MatmulColumnSums, AnOnlyEpilogueIsKept) {
  Case k;
  const ValueId x = k.circuit.add_external({Shape{64, 300}, DType::f32}, ValueRole::Input, "x");
  const ValueId w = k.circuit.add_external({Shape{64, 200}, DType::f32}, ValueRole::Input, "w");
  Builder b(k.circuit, "test");
  // x read through a transpose (a view fuse_matmul folds: a fused_matmul whose one epilogue is in0).
  const ValueId xt = b.permute(b.cast(x, DType::bf16), {1, 0});
  k.outputs = {b.reduce(ReduceKind::Sum, b.matmul(xt, b.cast(w, DType::bf16)), 0)};
  for (const ValueId v : {x, w})
    k.bindings.push_back(testing::random_tensor({k.circuit.info(v).shape, DType::f32}, 60 + static_cast<uint64_t>(v)));
  const std::vector<HostTensor> want = execute(k.circuit, k.bindings, k.outputs);
  std::vector<ValueId> outs = k.outputs;
  const Circuit planned = optimize(k.circuit, outs, cuda_target(90, /*fake=*/true));
  EXPECT_EQ(block_summing(planned), std::make_pair(size_t{1}, size_t{2})) << planned.dump("planned");
  cuda::DeviceProgram dp(planned, outs, testing::fake_runtime());
  EXPECT_LT(testing::relative_error(dp.run(k.bindings)[0], want[0]), 1e-5);
}

TEST(MatmulColumnSums, TheSwitchKeepsTheColumnSumsOfTheStoredEpilogue) {
  Case k = bias_gradient(300, 64, true);
  std::vector<ValueId> outs = k.outputs;
  EXPECT_EQ(block_summing(optimize(k.circuit, outs, cuda_target(90, /*fake=*/true),
                                   parse_pipeline_options("-matmul_column_sums")))
                .first,
            0u);
}

// Params round trip; block sums are not taken with row sums of a.
TEST(MatmulColumnSums, BlockSumsRoundTripThroughParams) {
  FusedMatmul f = FusedMatmul::plain(Shape{300, 16}, Shape{16, 8}, false, false);
  f.block_sums = true;
  f.block_sums_body = se::in(0) * se::c(2.0);
  const FusedMatmul back = FusedMatmul::from_params(f.to_params(DType::f32));
  EXPECT_TRUE(back.block_sums);
  EXPECT_EQ(back.block_sums_body, f.block_sums_body);
  EXPECT_EQ(back.epilogues.size(), 1u);
  EXPECT_EQ(back.block_sums_shape(), (Shape{3, 8}));
  Circuit c;
  const ValueId a = c.add_external({Shape{300, 16}, DType::f32}, ValueRole::Input, "a");
  const ValueId w = c.add_external({Shape{16, 8}, DType::f32}, ValueRole::Input, "w");
  const std::vector<ValueId> out = c.add_op(PrimId::fused_matmul, f.to_params(DType::f32), {a, w});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(c.info(out[1]).shape, (Shape{3, 8}));
  f.a_row_sums = true;
  f.row_sums_shape = Shape{300};
  EXPECT_THROW(c.add_op(PrimId::fused_matmul, f.to_params(DType::f32), {a, w}), Error);
}

}  // namespace
}  // namespace kiln
