// Which tiles, grids and splits of K the GPU matmul kernels take (cuda/lower/matmul_tiling.cpp's
// choose_mma_tiling, choose_splits and fold_batch_into_rows): split-K auto,
// tile=auto, waves and 192x256, the wgmma default of an sm_90 lowering, and batch dims
// folded into the rows. Each checks the kernels' summaries; the small products also run in the
// SIMT simulator against the Eigen executor (the kernels' values under every tiling:
// test_matmul_lowering.cpp).
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <tuple>
#include <utility>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

#include "device_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using testing::f32;

// The fake device's Target with the bf16 mma kernel and the --matmul items `matmul`.
Target fake(const std::string& matmul = "") {
  return testing::with_matmul(cuda::device_target(testing::fake_runtime()), "bf16-mma=on," + matmul);
}

// The lowered plan of cast(a, bf16) cast(b, bf16) (a transposed where `ta`), run against Eigen
// in the simulator where `run`; its dump.
std::string split_dump(Shape a, Shape b, bool ta, bool run, const Target& target) {
  testing::Harness h({f32(std::move(a)), f32(std::move(b))}, [ta](Builder& bld, const std::vector<ValueId>& x) {
    return bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16), ta, false);
  });
  cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime(), target);
  if (run) {
    const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
    EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5);
  }
  return dp.dump();
}

// split-k=auto splits K where the grid fills less than half the SMs' block slots, as
// many ways as fit (up to 4, each range 8 steps or more): GPT-2 small's attention-projection
// weight gradient (768 x 768 outputs over 8192 tokens: 36 blocks) 4 ways, a 64 x 64 x 512
// product 2 ways (16 steps), a 4096^2 product not at all. Lowered only (no run) where large.
TEST(Lowering, Bf16MmaSplitsKWhereTheGridLeavesSmsIdle) {
  const Target split = fake("split-k=auto");
  std::string d = split_dump({8192, 768}, {8192, 768}, true, false, split);
  EXPECT_NE(d.find("K split 4 ways (2048 each"), std::string::npos) << d;
  d = split_dump({64, 512}, {512, 64}, false, true, split);
  EXPECT_NE(d.find("K split 2 ways (256 each"), std::string::npos) << d;
  d = split_dump({4096, 1024}, {1024, 4096}, false, false, split);
  EXPECT_NE(d.find("mma.sync bf16"), std::string::npos) << d;
  EXPECT_EQ(d.find("K split"), std::string::npos) << d;
  // K = 0, split forced or not: no split, zeros stored.
  for (const char* forced : {"auto", "2"}) {
    d = split_dump({40, 0}, {0, 24}, false, true, fake(std::string("split-k=") + forced));
    EXPECT_EQ(d.find("K split"), std::string::npos) << d;
  }
}

// split-k unset: auto on wgmma, none on mma.sync. The attention projection's weight
// gradient (768 x 768 outputs over 8192 tokens: 36 blocks of 128x128, one an SM on wgmma) splits
// 3 ways on wgmma, not at all on mma.sync; a 64 x 64 x 1024 product (16 steps of 64) splits 2 ways
// on wgmma and runs against Eigen.
TEST(Lowering, Bf16MmaSplitsKByDefaultOnWgmmaOnly) {
  for (const char* wgmma : {"on", "off"}) {
    SCOPED_TRACE(std::string("wgmma=") + wgmma);
    const Target target = fake(std::string("wgmma=") + wgmma);
    const bool on_wgmma = wgmma == std::string("on");
    std::string d = split_dump({8192, 768}, {8192, 768}, true, false, target);
    EXPECT_NE(d.find(on_wgmma ? "wgmma" : "mma.sync bf16"), std::string::npos) << d;
    EXPECT_EQ(d.find("K split 3 ways (2752 each") != std::string::npos, on_wgmma) << d;
    EXPECT_EQ(d.find("K split") != std::string::npos, on_wgmma) << d;
    if (on_wgmma) {
      d = split_dump({64, 1024}, {1024, 64}, false, true, target);
      EXPECT_NE(d.find("K split 2 ways (512 each"), std::string::npos) << d;
    }
  }
}

// tile=auto: 128x256 tiles where their grid fills an H100's 132 SMs (a 4096^2
// product: 512 blocks; GPT-2's MLP up projection, 8192 x 3072: 768), 128x128 where it would not
// (GPT-2's QKV weight gradient, 768 x 2304: 54 blocks of 128x256; a 64 x 64 product), on mma.sync
// and on wgmma. Lowered only (no run) where large; the small one runs against Eigen.
TEST(Lowering, Bf16MmaTileAutoTakes128x256WhereItsGridFillsTheSms) {
  for (const char* wgmma : {"off", "on"}) {
    SCOPED_TRACE(std::string("wgmma=") + wgmma);
    const Target target = fake(std::string("tile=auto,wgmma=") + wgmma);
    auto dump_of = [&target](Shape a, Shape b, bool run) {
      testing::Harness h({f32(std::move(a)), f32(std::move(b))}, [](Builder& bld, const std::vector<ValueId>& x) {
        return bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16));
      });
      cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime(), target);
      if (run) {
        const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
        EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5);
      }
      return dp.dump();
    };
    for (const auto& [a, b, wide] :
         {std::tuple{Shape{4096, 256}, Shape{256, 4096}, true}, std::tuple{Shape{8192, 768}, Shape{768, 3072}, true},
          std::tuple{Shape{768, 8192}, Shape{8192, 2304}, false}}) {
      const std::string d = dump_of(a, b, false);
      EXPECT_NE(d.find(wide ? "tile 128x256" : "tile 128x128"), std::string::npos) << d;
    }
    const std::string d = dump_of({64, 40}, {40, 64}, true);
    EXPECT_NE(d.find("tile 128x128"), std::string::npos) << d;
  }
}

// tile=waves (matmul_tiling.cpp: wave_tile): the tile of the least time in whole waves of
// 132 blocks, a 128x256 wave counted 1.6 and a 192x256 one 2.4. GPT-2's MLP weight gradient 768 x
// 3072 (144 blocks of 128x128: two waves; 72 of 128x256: one; 48 of 192x256: one) takes 128x256,
// which auto does not; 768 x 768 (36, 18 or 12 blocks: a wave each) and 1024^2 take 128x128;
// 4096^2 (1024, 512 or 352 blocks: 8, 4 or 3 waves: 8, 6.4, 7.2) 128x256; 8192 x 768 (384, 192 or
// 129 blocks: 3, 3.2 or 2.4) and 8192 x 2304 (9, 8 or 7.2) 192x256; 8192 x 3072 (12, 9.6 or 9.6:
// a tie) 128x256. Without 192-row tiles (block sums: blocks_192 = 0) 8192 x 768 takes 128x128. On
// mma.sync (two 128x128 blocks an SM) waves is auto: 768 x 3072 takes 128x128.
TEST(Lowering, Bf16MmaTileWavesTakesTheTileOfFewerWaves) {
  const Target waves = fake("tile=waves,wgmma=on");
  auto dump_of = [](Shape a, Shape b, const Target& target) {
    testing::Harness h({f32(std::move(a)), f32(std::move(b))}, [](Builder& bld, const std::vector<ValueId>& x) {
      return bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16));
    });
    return cuda::DeviceProgram(h.circuit, {h.output}, testing::fake_runtime(), target).dump();
  };
  for (const auto& [m, n, want] : {std::tuple{768, 3072, "tile 128x256"}, std::tuple{768, 768, "tile 128x128"},
                                   std::tuple{1024, 1024, "tile 128x128"}, std::tuple{4096, 4096, "tile 128x256"},
                                   std::tuple{8192, 768, "tile 192x256"}, std::tuple{8192, 2304, "tile 192x256"},
                                   std::tuple{8192, 3072, "tile 128x256"}}) {
    const std::string d = dump_of({m, 64}, {64, n}, waves);
    EXPECT_NE(d.find(want), std::string::npos) << m << " x " << n << "\n" << d;
  }
  const std::array<cuda::MmaStage, 2> layout{cuda::MmaStage::row_k, cuda::MmaStage::row_k};
  const cuda::MmaTiling no_192 = cuda::choose_mma_tiling(layout, cuda::MmaInput::bf16, 384, 192, 0, waves);
  EXPECT_EQ(no_192.tm, 128);
  EXPECT_EQ(no_192.tn, 128);
  const std::string d = dump_of({768, 64}, {64, 3072}, fake("tile=waves,wgmma=off"));
  EXPECT_NE(d.find("mma.sync bf16"), std::string::npos) << d;
  EXPECT_NE(d.find("tile 128x128"), std::string::npos) << d;
}

// fold_batch_into_rows (matmul_tiling.cpp): x W + bias + r over [3, 70, C] activations (the rows
// continue from one batch item into the next in x, r and the output; W and the bias shared) is
// one product of 210 rows: 64x64 FFMA tiles in a 3 x 4 grid (unfolded: 3 x 2 x 3), 128x128
// mma.sync and wgmma tiles in 2 x 2 (2 x 1 x 3), 192x256 wgmma tiles in 1 x 2. A batched W, or a
// bias per item, keeps the batch in grid z; over [2, 3, 70, C] with a bias per outer item the
// inner dim folds and the outer stays (z = 2); a dim of size 1 ([3, 1, 70, C]) goes. The GPU plan
// (the epilogue fused) against Eigen in the simulator.
TEST(Lowering, BatchDimsTheRowsContinueThroughFoldIntoTheRows) {
  struct Shapes {
    const char* name;
    Shape x, w, bias;
    int64_t z;  // grid z expected (1: folded whole)
  };
  const Shapes cases[] = {{"folded", {3, 70, 40}, {40, 136}, {136}, 1},
                          {"batched W", {3, 70, 40}, {3, 40, 136}, {136}, 3},
                          {"a bias per item", {3, 70, 40}, {40, 136}, {3, 1, 136}, 3},
                          {"inner dim folded", {2, 3, 70, 40}, {40, 136}, {2, 1, 1, 136}, 2},
                          {"a dim of size 1", {3, 1, 70, 40}, {40, 136}, {136}, 1}};
  auto check = [](const Shapes& s, bool bf16, const Target& target) {
    Shape out = s.x;
    out[out.rank() - 1] = 136;
    testing::Harness h({f32(s.x), f32(s.w), f32(s.bias), f32(out)},
                       [bf16](Builder& bld, const std::vector<ValueId>& x) {
                         auto operand = [&](ValueId v) { return bf16 ? bld.cast(v, DType::bf16) : v; };
                         return bld.add(bld.add(bld.matmul(operand(x[0]), operand(x[1])), x[2]), x[3]);
                       });
    std::vector<ValueId> outs{h.output};
    const Circuit planned = optimize(h.circuit, outs, target);
    cuda::DeviceProgram dp(planned, outs, testing::fake_runtime(), target);
    EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], execute(h.circuit, h.bindings, {h.output})[0]), 1e-5)
        << dp.dump();
    EXPECT_NE(dp.dump().find("fused_matmul"), std::string::npos) << dp.dump();
    return dp.dump();
  };
  struct Setting {
    const char *name, *wgmma, *tile;
    bool bf16;
    int64_t grid_x, folded_y, item_y, block;  // the grid: x, y folded (210 rows) or per item (70)
  };
  for (const Setting& t : {Setting{"f32 FFMA", "off", "", false, 3, 4, 2, 256},
                           Setting{"bf16 mma.sync", "off", "128x128", true, 2, 2, 1, 256},
                           Setting{"bf16 wgmma", "on", "128x128", true, 2, 2, 1, 256},
                           Setting{"bf16 wgmma 192x256", "on", "192x256", true, 1, 2, 1, 384}}) {
    SCOPED_TRACE(t.name);
    const Target target =
        fake(std::string("wgmma=") + t.wgmma + (*t.tile ? std::string(",tile=") + t.tile : std::string()));
    for (const Shapes& s : cases) {
      SCOPED_TRACE(s.name);
      const bool folded = s.z != 3;  // the 70 rows of the three items are one product's
      const std::string grid = "grid " + std::to_string(t.grid_x) + "x" +
                               std::to_string(folded ? t.folded_y : t.item_y) + "x" + std::to_string(s.z) + ", block " +
                               std::to_string(t.block);
      const std::string dump = check(s, t.bf16, target);
      EXPECT_NE(dump.find(grid), std::string::npos) << grid << "\n" << dump;
    }
  }
}

// tile=192x256: on wgmma, three warpgroups (384 threads, declared to ptxas as the
// block's size so that it keeps to 168 registers) over 192-row tiles, 4 stages of 56 KiB; split-K
// is not taken in them. On mma.sync: 128x256. (Values: check_wgmma_cases.)
TEST(Lowering, Bf16MmaTile192x256TakesThreeWarpgroupsOnWgmma) {
  testing::Harness h({f32({400, 128}), f32({128, 520})}, [](Builder& bld, const std::vector<ValueId>& x) {
    return bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16));
  });
  for (const char* wgmma : {"on", "off"}) {
    const cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime(),
                                 fake(std::string("tile=192x256,split-k=2,wgmma=") + wgmma));
    const std::string d = dp.dump();
    if (wgmma == std::string("on")) {
      EXPECT_NE(d.find("tile 192x256x64, 384 threads, wgmma m64n256k16 bf16 on three warpgroups"), std::string::npos)
          << d;
      EXPECT_NE(d.find("4 cp.async stages"), std::string::npos) << d;
      EXPECT_NE(d.find("grid 3x3x1, block 384"), std::string::npos) << d;
      EXPECT_EQ(d.find("K split"), std::string::npos) << d;
      size_t matmuls = 0;  // the other kernels: the operands' casts
      for (const auto& kl : dp.kernels()) {
        const kir::Kernel& k = *kl.launch->kernel;
        if (k.name.find("matmul") == std::string::npos) continue;
        ++matmuls;
        EXPECT_EQ(k.max_threads, 384);
        EXPECT_NE(kir::print_ptx(k, 90).find(".maxntid 384, 1, 1"), std::string::npos);
      }
      EXPECT_EQ(matmuls, 1u);
    } else {
      EXPECT_NE(d.find("tile 128x256x32, 256 threads, mma.sync bf16"), std::string::npos) << d;
    }
  }
}

// wgmma and the tile unset: mma.sync at 128x128 unless the Target is a real sm_90 GPU (an H100 or
// H200; the fake driver, though it reports sm_90, is not), which takes wgmma with auto tiles
// (128x256 for GPT-2's MLP up projection, 768 blocks); wgmma=on|off decides either way.
TEST(Lowering, Bf16MatmulsTakeWgmmaWithAutoTilesWhenLoweredForSm90) {
  auto dump_of = [](const Target& target) {
    testing::Harness h({f32({8192, 768}), f32({768, 3072})}, [](Builder& bld, const std::vector<ValueId>& x) {
      return bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16));
    });
    return cuda::DeviceProgram(h.circuit, {h.output}, testing::fake_runtime(), target).dump();
  };
  for (const char* setting : {"", "off", "on"}) {
    SCOPED_TRACE(std::string("wgmma=") + setting);
    for (const Target& device :
         {cuda_target(80, /*fake=*/false), cuda_target(90, /*fake=*/true), cuda_target(90, /*fake=*/false)}) {
      SCOPED_TRACE(device.str());
      const bool sm90 = device.sm == 90 && !device.fake;
      const Target target = testing::with_matmul(device, *setting ? std::string("wgmma=") + setting : "");
      const bool wgmma = std::string(setting) == "on" || (sm90 && std::string(setting).empty());
      const std::string d = dump_of(target);
      EXPECT_NE(d.find(wgmma ? "wgmma m64n256k16" : "mma.sync bf16"), std::string::npos) << d;
      EXPECT_NE(d.find(wgmma ? "tile 128x256" : "tile 128x128"), std::string::npos) << d;
    }
  }
}

// The f32 FFMA kernel keeps two buffers a tile operand (128x128: 2 x 2 x 8 KiB) and waits at one
// barrier a k step of 16 (one before the loop, one in each half of the loop unrolled by two), and
// it declares its 256 threads to ptxas (.maxntid) and, in 128x128 tiles, the two blocks an SM it
// is built for (.minnctapersm 2; 64x64 tiles do not ask). K = 0 (no step: zeros), 8 (one partial
// step), 40 and 48 (three steps: the second half of the last pass skipped) and 64 run against
// Eigen. (Row sums read the buffers too: the fused_matmul prim cases with K = 70 and 45.)
TEST(Lowering, FfmaMatmulsKeepTwoTileBuffersAndDeclareTheirBlock) {
  const Target large = testing::with_matmul(cuda::device_target(testing::fake_runtime()), "simt-tile=128");
  for (int64_t k : {0, 8, 40, 48, 64}) {
    SCOPED_TRACE(k);
    testing::Harness h({f32({256, k}), f32({k, 256})},
                       [](Builder& bld, const std::vector<ValueId>& x) { return bld.matmul(x[0], x[1]); });
    cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime(), large);
    size_t matmuls = 0;
    for (const auto& kl : dp.kernels()) {
      const kir::Kernel& kernel = *kl.launch->kernel;
      if (!kernel.name.starts_with("kiln_matmul_")) continue;
      ++matmuls;
      EXPECT_EQ(kernel.max_threads, 256);
      EXPECT_EQ(kernel.shared_bytes(), 32768);
      const std::string ptx = kir::print_ptx(kernel, 90);
      EXPECT_NE(ptx.find(".maxntid 256, 1, 1\n.minnctapersm 2\n"), std::string::npos) << ptx.substr(0, 600);
      EXPECT_EQ(testing::occurrences(ptx, "bar.sync"), 3u) << ptx;
    }
    EXPECT_EQ(matmuls, 1u) << dp.dump();
    const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
    EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), 1e-5);
  }
  testing::Harness h({f32({64, 32}), f32({32, 64})},
                     [](Builder& bld, const std::vector<ValueId>& x) { return bld.matmul(x[0], x[1]); });
  cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime(),
                         testing::with_matmul(cuda::device_target(testing::fake_runtime()), "simt-tile=64"));
  for (const auto& kl : dp.kernels()) {
    const std::string ptx = kir::print_ptx(*kl.launch->kernel, 90);
    EXPECT_NE(ptx.find(".maxntid 256, 1, 1"), std::string::npos);
    EXPECT_EQ(ptx.find(".minnctapersm"), std::string::npos);
  }
}

// A lowering that declares its block (KernelBuilder::declare_block_threads) must launch that block.
TEST(Lowering, ADeclaredBlockMustBeTheLaunchedOne) {
  kir::KernelBuilder b("declared_block");
  b.declare_block_threads(128);
  EXPECT_THROW(cuda::finish_launch(b, "kiln_declared", {1, 1, 1}, {256, 1, 1}, {}), Error);
  kir::KernelBuilder same("declared_block");
  same.declare_block_threads(128);
  EXPECT_EQ(cuda::finish_launch(same, "kiln_declared", {1, 1, 1}, {128, 1, 1}, {}).kernel->max_threads, 128);
}

}  // namespace
}  // namespace kiln
