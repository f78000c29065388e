// T3/T4 for the matmul kernels' lowering (the shared parts in lowering_test_util.hpp): the
// FFMA tiles forced large, the tf32 and bf16 tensor-core kernels (mma.sync with cp.async stages,
// and sm_90a's wgmma) over every tiling, split-K, the fused epilogues of whole tiles and sliced
// operands, each in the SIMT simulator against the Eigen executor; their kernels in ptxas without
// spills; the simulator's bank-conflict counts of their shared memory; and their instruction
// counts (printed for docs/BENCHMARKS.md). Which tiling a product takes: test_matmul_tiling.cpp;
// bf16 rows padded to whole 16-byte chunks (pad_bf16_rows): test_pad_bf16_rows.cpp.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/lower/util.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

#include "device_test_util.hpp"
#include "lowering_test_util.hpp"
#include "prim_cases.hpp"
#include "prim_test_util.hpp"
#include "ptxas_skip.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using testing::BuildFn;
using testing::check_case;
using testing::f32;
using testing::InputSpec;
using testing::lowered_kernels;
using testing::LoweringCase;

// The 128x128 tiles (8x8 outputs a thread), which the GPU takes for large products, forced onto
// every matmul case (the 64x64 tiles run in test_lowering.cpp): the simulator against Eigen
// (sizes that are not multiples of the tile, batches, views, prologues, epilogues, row sums),
// and ptxas for sm_80 and sm_90 without spills.
std::vector<LoweringCase> matmul_cases() {
  std::vector<LoweringCase> out;
  for (const LoweringCase& lc : testing::all_prim_cases().lowering)
    if (lc.name.find("matmul") != std::string::npos) out.push_back(lc);
  return out;
}

// tf32 keeps 10 of f32's 23 mantissa bits; the kernels round operands to nearest (cvt.rna.tf32),
// each within 2^-11 relative, so each product is within 2^-10 ~ 1e-3 and so is the norm-relative
// error of a sum of products (cancellation aside). A wrong fragment or accumulator mapping gives
// errors near 1.
constexpr double kTf32Tolerance = 1e-3;

// Products with blocks wholly inside c (the tensor-core kernels store those without bounds
// checks, at immediate offsets, column pairs as 8-byte stores) and blocks on its edges, with the
// GPT's epilogues, which fuse_matmul folds into the kernel (fused_interior_programs): a bias and
// GELU, a residual, and a biased output stored transposed (column stride not 1: no pairs). Operands cast to bf16 where
// `bf16` (the bf16 mma kernel), else f32. 1e-5, as the f32 matmul cases (in bf16 both sides multiply the same bf16
// values).
std::vector<LoweringCase> interior_matmul_cases(bool bf16) {
  auto operand = [bf16](Builder& bld, ValueId x) { return bf16 ? bld.cast(x, DType::bf16) : x; };
  const std::string prefix = bf16 ? "bf16_mma_interior_" : "interior_";
  const double tolerance = 1e-5;
  return {LoweringCase{prefix + "bias_gelu",
                       {f32({260, 40}), f32({300, 40}), f32({300})},
                       [operand](Builder& bld, const std::vector<ValueId>& x) {
                         ValueId y = bld.matmul(operand(bld, x[0]), operand(bld, x[1]), false, true);
                         return bld.pointwise(se::gelu(se::in(0)), {bld.add(y, x[2])});
                       },
                       tolerance},
          LoweringCase{prefix + "residual",
                       {f32({256, 64}), f32({64, 256}), f32({256, 256})},
                       [operand](Builder& bld, const std::vector<ValueId>& x) {
                         return bld.add(bld.matmul(operand(bld, x[0]), operand(bld, x[1])), x[2]);
                       },
                       tolerance},
          // A batch of 2 (each batch's output a 130 x 136 block further on: the pair stores'
          // alignment holds through the batch offset) with a bias; b batched too, so that the
          // batch stays in grid z (a shared b would fold it into the rows).
          LoweringCase{prefix + "batched",
                       {f32({2, 130, 48}), f32({2, 48, 136}), f32({136})},
                       [operand](Builder& bld, const std::vector<ValueId>& x) {
                         return bld.add(bld.matmul(operand(bld, x[0]), operand(bld, x[1])), x[2]);
                       },
                       tolerance},
          LoweringCase{prefix + "transposed_out",
                       {f32({136, 72}), f32({72, 264}), f32({264})},
                       [operand](Builder& bld, const std::vector<ValueId>& x) {
                         ValueId y = bld.matmul(operand(bld, x[0]), operand(bld, x[1]));
                         return bld.transpose(bld.add(y, x[2]), 0, 1);
                       },
                       tolerance}};
}

// The interior cases after fuse_matmul, lowered for `target` on `rt`: one program each, in case
// order.
std::vector<std::unique_ptr<cuda::DeviceProgram>> fused_interior_programs(bool bf16, cuda::Runtime& rt,
                                                                          const Target& target) {
  std::vector<std::unique_ptr<cuda::DeviceProgram>> programs;
  for (const LoweringCase& lc : interior_matmul_cases(bf16)) {
    testing::Harness h(lc.inputs, lc.build, 7);
    std::vector<ValueId> outs{h.output};
    const Circuit fused = fuse_matmul(h.circuit, outs, target);
    for (const Op& op : fused.ops()) {  // the transposed case's output is stored through its view
      if (op.is(PrimId::fused_matmul) && lc.name.find("transposed_out") != std::string::npos) {
        EXPECT_EQ(FusedMatmul::from_params(op.params).out_col, 136) << fused.dump("fused");
      }
    }
    programs.push_back(std::make_unique<cuda::DeviceProgram>(fused, outs, rt, target));
  }
  return programs;
}

// The interior cases, fused, against Eigen: each program's dump must show `summary` (the kernel
// asked for) and `kernel`, and the matmul's epilogue (no separate pointwise kernel).
void check_fused_interior_cases(cuda::Runtime& rt, const Target& target, bool bf16, double tolerance,
                                const std::string& summary, const std::string& kernel = "") {
  const std::vector<LoweringCase> lcs = interior_matmul_cases(bf16);
  const std::vector<std::unique_ptr<cuda::DeviceProgram>> programs = fused_interior_programs(bf16, rt, target);
  for (size_t i = 0; i < lcs.size(); ++i) {
    SCOPED_TRACE(lcs[i].name);
    testing::Harness h(lcs[i].inputs, lcs[i].build, 7);
    const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
    const std::string dump = programs[i]->dump();
    EXPECT_NE(dump.find(summary), std::string::npos) << dump;
    EXPECT_NE(dump.find(kernel), std::string::npos) << dump;  // "" where either kernel may take it
    EXPECT_EQ(dump.find("pointwise"), std::string::npos) << dump;
    EXPECT_LT(testing::relative_error(programs[i]->run(h.bindings)[0], want), tolerance) << dump;
  }
}

// Every matmul case with its kernel forced to 128x128 tiles, FFMA or tf32 tensor cores: `summary`
// must appear in the program's dump (the kernel asked for ran; bf16 cases, with the bf16 mma
// kernel off, always take the tf32 tensor cores on widened tiles), and each case is checked
// against Eigen at `tolerance` (0: the case's own).
void check_forced_matmul_cases(cuda::Runtime& rt, bool tf32, double tolerance, const std::string& summary) {
  Target target = testing::with_matmul(cuda::device_target(rt), "simt-tile=128,bf16-mma=off");
  target.tf32 = tf32;
  const std::vector<LoweringCase> mm = matmul_cases();
  EXPECT_GE(mm.size(), 9u);
  for (LoweringCase lc : mm) {
    SCOPED_TRACE(lc.name);
    if (tolerance > 0) lc.tolerance = tolerance;
    std::string dump;
    check_case(lc, rt, target, &dump);
    // bf16 operands take the tensor cores on large tiles whatever is allowed for f32.
    const bool bf16 = lc.name.find("bf16") != std::string::npos;
    EXPECT_NE(dump.find(bf16 ? "mma.sync tf32" : summary), std::string::npos) << dump;
  }
  // The interior cases' operands are aligned f32: with tf32 the cp.async kernel takes them.
  check_fused_interior_cases(rt, target, false, tolerance > 0 ? tolerance : 1e-5, tf32 ? "rounded to tf32" : summary);
}
const char* const kLargeFfmaSummary = "tile 128x128x16, 256 threads x 8x8";

TEST(Lowering, MatmulCasesWithLargeTilesMatchEigen) {
  check_forced_matmul_cases(testing::fake_runtime(), false, 0, kLargeFfmaSummary);
}

// T5: the same on a real GPU.
TEST(Lowering, GpuMatmulCasesWithLargeTilesMatchEigen) {
  KILN_GPU_OR_SKIP(rt);
  check_forced_matmul_cases(*rt, false, 0, kLargeFfmaSummary);
}

// The tf32 tensor-core kernel (Target::tf32) within kTf32Tolerance. Measured on these cases:
// 2.6e-4 (6.9e-4 before the rounding, when mma.sync truncated).

TEST(Lowering, MatmulCasesOnTf32TensorCoresMatchEigen) {
  check_forced_matmul_cases(testing::fake_runtime(), true, kTf32Tolerance, "mma.sync tf32");
}

TEST(Lowering, GpuMatmulCasesOnTf32TensorCoresMatchEigen) {
  KILN_GPU_OR_SKIP(rt);
  check_forced_matmul_cases(*rt, true, kTf32Tolerance, "mma.sync tf32");
}

// The cp.async mma.sync kernel: operands stored with k contiguous ([row][k] stages) or with rows
// contiguous ([k][row] stages); sizes off the 128x128 tile, K of 1, 2, 3 and 7 steps of 32 (a
// partial last one: with 4 stages 7 steps wrap around the stages twice), a batch broadcasting b,
// an epilogue with a bias. `bf16`: the operands cast to bf16 (bf16-mma=on, the default;
// ldmatrix), both sides multiplying the same bf16 values exactly: 1e-5, as f32. Else f32
// operands for the tf32 kernel (Target::tf32; fragments rounded to tf32): kTf32Tolerance.
// Chunks partly past the matrix: the sliced cases below. A b whose rows are not 16-byte aligned
// must take the widened-tile kernel instead.
std::vector<LoweringCase> mma_cases(bool bf16) {
  auto mm = [bf16](const std::string& name, Shape a, Shape b, bool ta, bool tb, bool bias) {
    const int64_t n = tb ? b[b.rank() - 2] : b[b.rank() - 1];
    return LoweringCase{(bf16 ? "bf16_mma_" : "tf32_mma_") + name,
                        {f32(a), f32(b), f32({n})},
                        [bf16, bias, ta, tb](Builder& bld, const std::vector<ValueId>& x) {
                          auto operand = [&](ValueId v) { return bf16 ? bld.cast(v, DType::bf16) : v; };
                          ValueId y = bld.matmul(operand(x[0]), operand(x[1]), ta, tb);
                          return bias ? bld.add(y, x[2]) : y;
                        },
                        bf16 ? 1e-5 : kTf32Tolerance};
  };
  return {mm("k16", {67, 16}, {91, 16}, false, true, false), mm("k64_bias", {130, 64}, {77, 64}, false, true, true),
          mm("k72", {40, 72}, {200, 72}, false, true, false), mm("batched", {2, 33, 48}, {19, 48}, false, true, true),
          // b stored [k][n] (x W): [k][row] stages for b.
          mm("b_rows", {67, 40}, {40, 96}, false, false, false),
          // a and b both stored [k][row] (a weight gradient, X^T dY); K = 37 not a multiple of 8.
          mm("a_rows_b_rows", {37, 136}, {37, 64}, true, false, true),
          // a [k][row], b [row][k].
          mm("a_rows", {72, 72}, {90, 72}, true, true, false),
          mm("batched_a_rows", {2, 24, 40}, {24, 16}, true, false, false),
          mm("k200", {70, 200}, {40, 200}, false, true, false),
          mm("a_rows_k200", {200, 40}, {200, 72}, true, false, true)};
}

// Every tiling the bf16 mma kernel takes (MatmulPolicy tile and stages): `check` runs under each,
// with `base` taking the tiling.
struct MmaTilingCase {
  const char* tile;
  const char* stages;
  // `base` with this tiling (and `more`, further --matmul items).
  Target on(const Target& base, const std::string& more = "") const {
    return testing::with_matmul(base,
                                std::string("tile=") + tile + ",stages=" + stages + (more.empty() ? "" : ",") + more);
  }
};
constexpr MmaTilingCase kMmaTilings[] = {{"128x128", "2"}, {"128x128", "3"}, {"128x128", "4"},
                                         {"128x256", "2"}, {"128x256", "3"}, {"128x256", "4"}};
template <class Check>
void for_each_mma_tiling(const Target& base, Check check) {
  for (const MmaTilingCase& t : kMmaTilings) {
    SCOPED_TRACE(std::string(t.tile) + ", " + t.stages + " stages");
    check(t, t.on(base));
  }
}

// The kernel summary's text for a tiling: "tile 128x256x32" ... "3 cp.async stages". Four stages
// of 128x256 tiles with both operands staged [k][row] (rows of 272 and 528 bytes) would take 100
// KiB, over kir::kMaxSharedBytes: those kernels take 3 (`both_rows`: the case's a and b are
// stored with rows contiguous).
bool names_mma_tiling(const std::string& dump, const MmaTilingCase& t, bool both_rows, bool bf16) {
  const bool cut = std::string(t.tile) == "128x256" && std::string(t.stages) == "4" && both_rows;
  const std::string stages = std::string(cut ? "3" : t.stages) + " cp.async stages";
  return dump.find(std::string("tile ") + t.tile + (bf16 ? "x32" : "x16")) != std::string::npos &&
         dump.find(stages) != std::string::npos &&
         dump.find(bf16 ? "mma.sync bf16" : "fragments rounded to tf32") != std::string::npos;
}

// Slices folded into the matmul's views by fuse_matmul leave chunks partly inside the matrix;
// the copies zero-fill the rest. a^T b with b 60 (f32: 62) of 64 columns: the last chunk of 8
// (4) rows of b's [k][row] stages has 4 (2) inside. a b with a 61 of 64 columns: the last chunk
// of 8 (4) k of a's [row][k] stages has 5 (1) inside (K = 61). `bf16` as mma_cases.
void check_mma_sliced_cases(cuda::Runtime& rt, const Target& target, bool bf16, const std::string& kernel = "") {
  const std::string summary = !kernel.empty() ? kernel : bf16 ? "mma.sync bf16" : "rounded to tf32";
  auto check_sliced = [&rt, &target, bf16, summary](const std::string& name, std::vector<InputSpec> inputs,
                                                    BuildFn build) {
    SCOPED_TRACE(name);
    testing::Harness h(std::move(inputs), std::move(build), 7);
    const HostTensor want = execute(h.circuit, h.bindings, {h.output})[0];
    std::vector<ValueId> outs{h.output};
    const Circuit fused = fuse_matmul(h.circuit, outs, target);
    cuda::DeviceProgram dp(fused, outs, rt, target);
    EXPECT_NE(dp.dump().find(summary), std::string::npos) << dp.dump();
    EXPECT_EQ(testing::count_prim(fused, PrimId::slice), 0u) << fused.dump("fused");
    EXPECT_LT(testing::relative_error(dp.run(h.bindings)[0], want), bf16 ? 1e-5 : kTf32Tolerance);
  };
  auto stored = [bf16](Builder& bld, ValueId x) { return bf16 ? bld.cast(x, DType::bf16) : x; };
  check_sliced("rows_partly_inside", {f32({37, 32}), f32({37, 64})},
               [stored, bf16](Builder& bld, const std::vector<ValueId>& x) {
                 return bld.matmul(stored(bld, x[0]), bld.slice(stored(bld, x[1]), 1, 0, bf16 ? 60 : 62), true);
               });
  // The 3 columns past a's slice are infinities: a copy that read them would multiply them by b's
  // zero-filled rows past K and give NaN (rows past M or N reach only outputs never stored).
  check_sliced(
      "k_partly_inside", {f32({40, 61}), f32({61, 64})}, [stored](Builder& bld, const std::vector<ValueId>& x) {
        ValueId padded = bld.concat({x[0], bld.fill({40, 3}, DType::f32, std::numeric_limits<double>::infinity())}, 1);
        return bld.matmul(bld.slice(stored(bld, padded), 1, 0, 61), stored(bld, x[1]));
      });
}

// The cases whose a and b are both stored with rows contiguous (both staged [k][row]).
bool both_rows_contiguous(const std::string& name) {
  for (const char* kind : {"a_rows_b_rows", "batched_a_rows", "a_rows_k200"})
    if (name.size() > 4 && name.substr(name.find("_mma_") + 5) == kind) return true;
  return false;
}

// The mma cases on `rt` under every tiling, and split-K under two; `bf16` as mma_cases. The tf32
// kernel runs with tf32 allowed (Target::tf32); bf16 on mma.sync also where a real H100 would
// take wgmma by default. `wide_indices`: on the kernel's 64-bit index path.
void check_mma_cases(cuda::Runtime& rt, bool bf16, bool wide_indices = false) {
  Target base = testing::with_matmul(cuda::device_target(rt), "bf16-mma=on,wgmma=off");
  base.tf32 = !bf16;
  base.wide_indices = wide_indices;
  const double tolerance = bf16 ? 1e-5 : kTf32Tolerance;
  for_each_mma_tiling(base, [&](const MmaTilingCase& t, const Target& target) {
    for (const LoweringCase& lc : mma_cases(bf16)) {
      SCOPED_TRACE(lc.name);
      std::string dump;
      check_case(lc, rt, target, &dump);
      EXPECT_TRUE(names_mma_tiling(dump, t, both_rows_contiguous(lc.name), bf16)) << dump;
    }
    check_fused_interior_cases(rt, target, bf16, tolerance, std::string("tile ") + t.tile + (bf16 ? "x32" : "x16"),
                               bf16 ? "mma.sync bf16" : "rounded to tf32");
    check_mma_sliced_cases(rt, target, bf16);
  });
  // Split-K (MatmulPolicy::split_k): K in 2 or 3 ranges across blocks, their partials added by each
  // tile's last block; batches, every layout, K of 2-7 steps (k200: ranges of 96, 96 and 8 in
  // bf16), and the epilogues after the sum. The sums' order differs from one block's: the same
  // tolerances.
  for (const char* split : {"2", "3"})
    for (const MmaTilingCase& t : {MmaTilingCase{"128x128", "3"}, MmaTilingCase{"128x256", "2"}}) {
      SCOPED_TRACE(std::string("split ") + split + ", " + t.tile + ", " + t.stages + " stages");
      const Target target = t.on(base, std::string("split-k=") + split);
      for (const LoweringCase& lc : mma_cases(bf16)) {
        SCOPED_TRACE(lc.name);
        std::string dump;
        check_case(lc, rt, target, &dump);
        if (lc.name.find("k200") != std::string::npos || lc.name.ends_with("_mma_batched")) {  // K of 7 and 2 steps
          EXPECT_NE(dump.find("K split"), std::string::npos) << dump;
        }
      }
      check_fused_interior_cases(rt, target, bf16, tolerance, "K split", bf16 ? "mma.sync bf16" : "rounded to tf32");
      check_mma_sliced_cases(rt, target, bf16);
    }
  if (!bf16) {
    // Every element 1 + 3 * 2^-12: tf32 (10 mantissa bits) rounds it to 1 + 2^-10 and truncation
    // would give 1, so each product is 2^-12 high rounded (4.9e-4 relative over K = 64 terms)
    // and about 3 * 2^-11 low truncated (1.5e-3): only operands rounded in the kernel pass.
    const double value = 1 + 3.0 / 4096;
    LoweringCase rounding{
        "tf32_mma_rounds_operands",
        {f32({1, 1})},
        [value](Builder& bld, const std::vector<ValueId>& x) {
          ValueId a = bld.fill({96, 64}, DType::f32, value), w = bld.fill({64, 80}, DType::f32, value);
          return bld.add(bld.matmul(a, w), bld.mul(x[0], bld.fill({1, 1}, DType::f32, 0.0)));
        },
        kTf32Tolerance};
    std::string dump;
    check_case(rounding, rt, base, &dump);
    EXPECT_NE(dump.find("rounded to tf32"), std::string::npos) << dump;
    return;
  }
  // b stored [k][n] with rows of 50 bf16 (100 bytes): its chunks are not 16-byte aligned, so
  // the widened-tile kernel runs it.
  LoweringCase unaligned{"bf16_b_unaligned_rows",
                         {f32({40, 16}), f32({16, 50})},
                         [](Builder& bld, const std::vector<ValueId>& x) {
                           return bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16));
                         },
                         1e-5};
  std::string dump;
  check_case(unaligned, rt, base, &dump);
  EXPECT_EQ(dump.find("mma.sync bf16"), std::string::npos) << dump;
}

TEST(Lowering, MatmulsOnBf16MmaMatchEigen) { check_mma_cases(testing::fake_runtime(), true); }

// The same kernel on f32 operands with tf32 allowed (cp.async stages of f32, fragments rounded
// to tf32 in registers).
TEST(Lowering, MatmulsOnTf32MmaMatchEigen) { check_mma_cases(testing::fake_runtime(), false); }

// The same on the kernel's 64-bit index path.
TEST(Lowering, MatmulsOnMmaMatchEigenWithWideIndices) {
  check_mma_cases(testing::fake_runtime(), true, true);
  check_mma_cases(testing::fake_runtime(), false, true);
}

TEST(Lowering, GpuMatmulsOnMmaMatchEigen) {
  KILN_GPU_OR_SKIP(rt);
  check_mma_cases(*rt, true);
  check_mma_cases(*rt, false);
}

// The bf16 cases on sm_90a's wgmma (wgmma=on; matmul.hpp): every tiling it takes (3
// and 4 stages, 128x256 tiles in 4 stages taking 193 KiB, 192x256 tiles of three warpgroups in 4
// taking 225 KiB), split-K (3 stages: a wait for every group but none; 4: all but one; none in
// 192-row tiles, whatever split-k says), the fused interior epilogues and the sliced
// operands' zero-fill; K of 1 to 4 steps of 64. The same bf16 values multiplied exactly on both
// sides: 1e-5, as mma.sync's.
constexpr MmaTilingCase kWgmmaTilings[] = {
    {"128x128", "3"}, {"128x128", "4"}, {"128x256", "3"}, {"128x256", "4"}, {"192x256", "4"}};
// `more`: further --matmul items. With tensor-copies=on every case but the one with a batch
// (bf16_mma_batched_a_rows: the other batched case folds its batch into the rows) fills its
// stages by tensor copies.
void check_wgmma_cases(cuda::Runtime& rt, const std::string& more = "") {
  const bool tensor_copies = more.find("tensor-copies=on") != std::string::npos;
  const Target base =
      testing::with_matmul(cuda::device_target(rt), "bf16-mma=on,wgmma=on" + (more.empty() ? "" : "," + more));
  for (const MmaTilingCase& t : kWgmmaTilings)
    for (const char* split : {"0", "2"}) {
      if (split == std::string("2") && t.tile == std::string("128x256") && t.stages == std::string("3")) continue;
      SCOPED_TRACE(std::string(t.tile) + ", " + t.stages + " stages, split " + split);
      const Target target = t.on(base, std::string("split-k=") + split);
      const bool three_groups = t.tile == std::string("192x256");
      const std::string summary = std::string("tile ") + t.tile + "x64, " + (three_groups ? "384" : "256") +
                                  " threads, wgmma m64n" + (t.tile + 4) + "k16";
      for (const LoweringCase& lc : mma_cases(true)) {
        SCOPED_TRACE(lc.name);
        std::string dump;
        check_case(lc, rt, target, &dump);
        EXPECT_NE(dump.find(summary), std::string::npos) << dump;
        const bool copied = tensor_copies && lc.name != "bf16_mma_batched_a_rows";
        EXPECT_NE(dump.find(std::string(t.stages) + (copied ? " tensor-copy stages" : " cp.async stages")),
                  std::string::npos)
            << dump;
        if (split == std::string("2") && lc.name.ends_with("k200")) {
          EXPECT_EQ(dump.find("K split 2 ways") != std::string::npos, !three_groups) << dump;
        }
      }
      check_fused_interior_cases(rt, target, true, 1e-5, "wgmma m64n");
      check_mma_sliced_cases(rt, target, true, "wgmma m64n");
      // A grid of 3 x 3 tiles or more (the cases above have one or two a dimension): whole-tile
      // blocks next to edge ones, with a weight-gradient layout (both operands [k][row]; rows of
      // 296 bf16: whole 16-byte chunks).
      for (bool ta : {false, true}) {
        const LoweringCase wide{std::string("bf16_wgmma_grid_3x3") + (ta ? "_a_rows" : ""),
                                {f32(ta ? Shape{200, 296} : Shape{296, 200}), f32({200, 520}), f32({520})},
                                [ta](Builder& bld, const std::vector<ValueId>& x) {
                                  ValueId y = bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16), ta);
                                  return bld.add(y, x[2]);
                                },
                                1e-5};
        SCOPED_TRACE(wide.name);
        std::string dump;
        check_case(wide, rt, target, &dump);
        EXPECT_NE(dump.find(summary), std::string::npos) << dump;
      }
    }
}

TEST(Lowering, MatmulsOnWgmmaMatchEigen) { check_wgmma_cases(testing::fake_runtime()); }

// products-first=on: each step issues its products before refilling step i - 2's stage; the same
// cases, every tiling (the summary says the order was taken).
void check_wgmma_cases_products_first(cuda::Runtime& rt) {
  check_wgmma_cases(rt, "products-first=on");
  std::string dump;
  check_case(mma_cases(true).front(), rt,
             testing::with_matmul(cuda::device_target(rt), "bf16-mma=on,wgmma=on,products-first=on"), &dump);
  EXPECT_NE(dump.find("a step's products issued before its copies"), std::string::npos) << dump;
}

TEST(Lowering, MatmulsOnWgmmaWithProductsFirstMatchEigen) { check_wgmma_cases_products_first(testing::fake_runtime()); }

// tensor-copies=on: the same cases, every tiling and split, with each stage filled by one tensor
// copy an operand (or a 64-row box) on its mbarrier; elements past the matrix (edge tiles, K = 37
// or 200) land as zeros.
void check_wgmma_cases_tensor_copies(cuda::Runtime& rt) { check_wgmma_cases(rt, "tensor-copies=on"); }

TEST(Lowering, MatmulsOnWgmmaWithTensorCopiesMatchEigen) { check_wgmma_cases_tensor_copies(testing::fake_runtime()); }

TEST(Lowering, GpuMatmulsOnWgmmaWithTensorCopiesMatchEigen) {
  KILN_GPU_OR_SKIP(rt);
  if (rt->sm() != 90) GTEST_SKIP() << "wgmma needs sm_90a; this GPU is sm_" << rt->sm();
  if (!rt->api().cuTensorMapEncodeTiled) GTEST_SKIP() << "the driver has no cuTensorMapEncodeTiled";
  check_wgmma_cases_tensor_copies(*rt);
}

TEST(Lowering, GpuMatmulsOnWgmmaMatchEigen) {
  KILN_GPU_OR_SKIP(rt);
  if (rt->sm() != 90) GTEST_SKIP() << "wgmma needs sm_90a; this GPU is sm_" << rt->sm();
  check_wgmma_cases(*rt);
}

TEST(Lowering, GpuMatmulsOnWgmmaWithProductsFirstMatchEigen) {
  KILN_GPU_OR_SKIP(rt);
  if (rt->sm() != 90) GTEST_SKIP() << "wgmma needs sm_90a; this GPU is sm_" << rt->sm();
  check_wgmma_cases_products_first(*rt);
}

// The kernels of the mma cases and the fused interior cases (bf16 or tf32 operands) lowered for
// `target`; `programs` keeps them alive.
std::vector<const kir::Kernel*> mma_case_kernels(bool bf16, std::vector<std::unique_ptr<cuda::DeviceProgram>>& programs,
                                                 const Target& target) {
  std::vector<const kir::Kernel*> kernels = lowered_kernels(mma_cases(bf16), programs, target);
  for (auto& p : fused_interior_programs(bf16, testing::fake_runtime(), target)) {
    for (const auto& k : p->kernels()) kernels.push_back(k.launch->kernel.get());
    programs.push_back(std::move(p));
  }
  return kernels;
}

// Both index widths (64-bit: tensors of 2^31 elements and more).
// Lowered for `target`: the bf16 mma cases and the fused interior cases pass ptxas (sm_80,
// sm_90) and spill nothing on sm_90; `label` names the setting in the printout.
void expect_mma_kernels_pass_ptxas(const std::string& label, bool bf16, Target target) {
  for (bool wide_indices : {false, true}) {
    // 64-bit indices: with the default tiling and the split ones only (ptxas's time)
    if (wide_indices && label.find("128x128, 2") == std::string::npos && label.find("K split") == std::string::npos)
      continue;
    target.wide_indices = wide_indices;
    std::vector<std::unique_ptr<cuda::DeviceProgram>> programs;
    const std::vector<const kir::Kernel*> kernels = mma_case_kernels(bf16, programs, target);
    std::set<std::string> seen;  // each matmul kernel once (the casts' kernels: other tests)
    for (const kir::Kernel* k : kernels) {
      if (k->name.find("matmul") == std::string::npos || !seen.insert(k->name).second) continue;
      EXPECT_TRUE(cuda::run_ptxas(kir::print_ptx(*k, 80), 80).ok) << k->name << " sm_80";
      const cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(*k, 90), 90);
      EXPECT_TRUE(r.ok) << k->name << ": " << r.log;
      EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << k->name << ": " << r.log;
      // Two 128x128 blocks of 256 threads an SM need 128 registers or fewer (u32 indices).
      if (label.starts_with("128x128") && !wide_indices) {
        EXPECT_LE(r.registers, 128) << k->name << " " << label;
      }
      std::printf("%s %s %s (%s indices): %d registers, %d bytes spilled, %lld bytes shared\n", k->name.c_str(),
                  bf16 ? "bf16" : "tf32", label.c_str(), wide_indices ? "u64" : "u32", r.registers, r.spill_stores,
                  static_cast<long long>(k->shared_bytes()));
    }
  }
}

// Every tiling, and K split 2 ways in the two tile sizes.
TEST(Lowering, MmaKernelsPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  Target base = testing::with_matmul(cuda::device_target(testing::fake_runtime()), "bf16-mma=on");
  for_each_mma_tiling(base, [](const MmaTilingCase& t, const Target& target) {
    expect_mma_kernels_pass_ptxas(std::string(t.tile) + ", " + t.stages + " stages", true, target);
  });
  for (const MmaTilingCase& t : {MmaTilingCase{"128x128", "4"}, MmaTilingCase{"128x256", "3"}})
    expect_mma_kernels_pass_ptxas(std::string(t.tile) + ", " + t.stages + " stages, K split 2 ways", true,
                                  t.on(base, "split-k=2"));
  // tf32 (f32 operands in the stages): the default tiling, the largest, and a split.
  base.tf32 = true;
  expect_mma_kernels_pass_ptxas("128x128, 2 stages", false, base);
  for (const MmaTilingCase& t : {MmaTilingCase{"128x256", "4"}, MmaTilingCase{"128x128", "3"}}) {
    const bool split = t.tile == std::string("128x128");
    expect_mma_kernels_pass_ptxas(std::string(t.tile) + ", " + t.stages + " stages" + (split ? ", K split 2 ways" : ""),
                                  false, t.on(base, split ? "split-k=2" : "split-k=0"));
  }
}

// The wgmma kernels (sm_90a only) of every tiling and a split, both index widths: no spills, and
// no ptxas advisory that the wgmmas are serialized (which it gives when accumulator registers are
// touched between them). Registers printed for docs/BENCHMARKS.md.
TEST(Lowering, WgmmaKernelsPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  const Target base = testing::with_matmul(cuda::device_target(testing::fake_runtime()), "bf16-mma=on,wgmma=on");
  for (const MmaTilingCase& t : kWgmmaTilings)
    for (const char* split : {"0", "2"})
      for (bool wide_indices : {false, true}) {
        if (wide_indices && t.stages == std::string("3")) continue;
        Target target = t.on(base, std::string("split-k=") + split);
        target.wide_indices = wide_indices;
        std::vector<std::unique_ptr<cuda::DeviceProgram>> programs;
        const std::vector<const kir::Kernel*> kernels = mma_case_kernels(true, programs, target);
        std::set<std::string> seen;
        for (const kir::Kernel* k : kernels) {
          if (!kir::needs_sm90a(*k) || !seen.insert(k->name).second) continue;
          const cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(*k, 90), 90);
          EXPECT_TRUE(r.ok) << k->name << ": " << r.log;
          EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << k->name << ": " << r.log;
          EXPECT_EQ(r.log.find("serialized"), std::string::npos) << k->name << ": " << r.log;
          std::printf("%s wgmma %s, %s stages, split %s (%s indices): %d registers, %lld bytes shared\n",
                      k->name.c_str(), t.tile, t.stages, split, wide_indices ? "u64" : "u32", r.registers,
                      static_cast<long long>(k->shared_bytes()));
        }
        EXPECT_FALSE(seen.empty());
      }
}

// The same with tensor-copies=on (4 stages, u32 indices): the kernels that copy by
// tensor copies among them, none spilling or serialized.
TEST(Lowering, WgmmaTensorCopyKernelsPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  for (const char* tiling : {"128x128", "128x256", "192x256"})
    for (const char* split : {"0", "2"}) {
      const Target target = testing::with_matmul(
          cuda::device_target(testing::fake_runtime()),
          std::string("bf16-mma=on,wgmma=on,tensor-copies=on,stages=4,tile=") + tiling + ",split-k=" + split);
      std::vector<std::unique_ptr<cuda::DeviceProgram>> programs;
      std::set<std::string> seen;
      int copying = 0;
      for (const kir::Kernel* k : mma_case_kernels(true, programs, target)) {
        if (!kir::needs_sm90a(*k) || !seen.insert(k->name).second) continue;
        const std::string ptx = kir::print_ptx(*k, 90);
        copying += ptx.find("cp.async.bulk.tensor.2d") != std::string::npos;
        const cuda::PtxasResult r = cuda::run_ptxas(ptx, 90);
        EXPECT_TRUE(r.ok) << k->name << ": " << r.log;
        EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << k->name << ": " << r.log;
        EXPECT_EQ(r.log.find("serialized"), std::string::npos) << k->name << ": " << r.log;
        std::printf("%s wgmma tensor copies %s, split %s: %d registers, %lld bytes shared\n", k->name.c_str(), tiling,
                    split, r.registers, static_cast<long long>(k->shared_bytes()));
      }
      EXPECT_GT(copying, 0) << tiling;
    }
}

void expect_matmul_kernels_pass_ptxas_without_spills(bool tf32) {
  Target target = testing::with_matmul(cuda::device_target(testing::fake_runtime()), "simt-tile=128");
  target.tf32 = tf32;
  std::vector<std::unique_ptr<cuda::DeviceProgram>> programs;
  const std::vector<const kir::Kernel*> kernels = lowered_kernels(matmul_cases(), programs, target);
  testing::expect_ptxas_accepts(kernels);
  for (const kir::Kernel* k : kernels) {
    const cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(*k, 90), 90);
    EXPECT_EQ(r.spill_stores + r.spill_loads, 0) << k->name << ": " << r.log;
    EXPECT_LE(r.registers, 255) << k->name;
    // Plain products (no prologue or epilogue) fit two blocks of 256 threads an SM: 128 registers
    // (an operand loaded along its rows once took 8 registers of address and bounds a slot: 139).
    if (k->name.starts_with("kiln_matmul_")) {
      EXPECT_LE(r.registers, 128) << k->name;
    }
  }
}

TEST(Lowering, MatmulKernelsWithLargeTilesPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  expect_matmul_kernels_pass_ptxas_without_spills(false);
}

TEST(Lowering, MatmulKernelsOnTf32TensorCoresPassPtxasWithoutSpills) {
  KILN_REQUIRE_PTXAS_OR_SKIP();
  expect_matmul_kernels_pass_ptxas_without_spills(true);
}

// The matmul kernel's shared memory, counted in the simulator: tile stores and the 16-byte
// fragment loads take no more wavefronts than their request phases, whichever operand is
// contiguous along k (A row-major, B transposed: both are; ta/tb flip them).
TEST(Lowering, MatmulSharedMemoryHasNoBankConflicts) {
  // 129: 128 on tf32 tensor cores, in the FFMA-tile kernel (sizes 94, 70 and 78: no row of 16-byte
  // chunks, which the cp.async kernel needs, in any layout).
  for (int tile : {64, 128, 129})
    for (auto [ta_, tb_] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
      Target target = testing::with_matmul(cuda::device_target(testing::fake_runtime()),
                                           "simt-tile=" + std::to_string(tile == 129 ? 128 : tile));
      target.tf32 = tile == 129;
      const bool ta = ta_, tb = tb_;  // plain variables: the lambda below captures them (clang 14)
      const int64_t m = tile == 129 ? 94 : 96, n = tile == 129 ? 70 : 72, k = tile == 129 ? 78 : 80;
      const Shape a = ta ? Shape{k, m} : Shape{m, k}, b = tb ? Shape{n, k} : Shape{k, n};
      testing::Harness h({f32(a), f32(b)},
                         [&](Builder& bl, const std::vector<ValueId>& x) { return bl.matmul(x[0], x[1], ta, tb); });
      cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime(), target);
      cuda::fake_driver_count_bank_conflicts(true);
      dp.run(h.bindings);
      const auto stats = cuda::fake_driver_kernel_stats();
      cuda::fake_driver_count_bank_conflicts(false);
      ASSERT_EQ(stats.size(), 1u);
      if (tile == 129) {
        EXPECT_EQ(dp.dump().find("rounded to tf32"), std::string::npos) << dp.dump();
      }
      const auto& [name, s] = *stats.begin();
      EXPECT_GT(s.shared_requests, 0) << name;
      EXPECT_EQ(s.bank_conflicts, 0) << name << " tile " << tile << " ta " << ta << " tb " << tb << ": "
                                     << s.shared_wavefronts << " wavefronts for " << s.shared_requests << " requests";
    }
}

// The same for the cp.async mma kernel: cp.async stores and ldmatrix rows (16 bytes a lane) of
// [row][k] stages (k-contiguous operands) and [k][row] stages (.trans; ta/tb flip them); with
// f32 operands (tf32), the scalar fragment loads (lanes on 8 rows of 4 k).
void expect_no_mma_bank_conflicts(const Target& target, bool bf16, const std::string& kernel = "") {
  for (auto [ta_, tb_] : {std::pair{false, false}, {false, true}, {true, false}, {true, true}}) {
    const bool ta = ta_, tb = tb_;  // plain variables: the lambda below captures them (clang 14)
    const Shape a = ta ? Shape{80, 96} : Shape{96, 80}, b = tb ? Shape{72, 80} : Shape{80, 72};
    testing::Harness h({f32(a), f32(b)}, [&](Builder& bl, const std::vector<ValueId>& x) {
      if (!bf16) return bl.matmul(x[0], x[1], ta, tb);
      return bl.matmul(bl.cast(x[0], DType::bf16), bl.cast(x[1], DType::bf16), ta, tb);
    });
    cuda::DeviceProgram dp(h.circuit, {h.output}, testing::fake_runtime(), target);
    ASSERT_NE(dp.dump().find(!kernel.empty() ? kernel
                             : bf16          ? "mma.sync bf16"
                                             : "rounded to tf32"),
              std::string::npos)
        << dp.dump();
    cuda::fake_driver_count_bank_conflicts(true);
    dp.run(h.bindings);
    const auto stats = cuda::fake_driver_kernel_stats();
    cuda::fake_driver_count_bank_conflicts(false);
    for (const auto& [name, s] : stats) {
      if (name.find("matmul") == std::string::npos) continue;
      EXPECT_GT(s.shared_requests, 0) << name;
      EXPECT_EQ(s.bank_conflicts, 0) << name << " ta " << ta << " tb " << tb << ": " << s.shared_wavefronts
                                     << " wavefronts for " << s.shared_requests << " requests";
    }
  }
}

TEST(Lowering, MmaSharedMemoryHasNoBankConflicts) {
  Target base = testing::with_matmul(cuda::device_target(testing::fake_runtime()), "bf16-mma=on");
  for_each_mma_tiling(base, [](const MmaTilingCase&, const Target& t) { expect_no_mma_bank_conflicts(t, true); });
  base.tf32 = true;  // f32 operands: stages of the same shape, scalar fragment loads
  for_each_mma_tiling(base, [](const MmaTilingCase&, const Target& t) { expect_no_mma_bank_conflicts(t, false); });
}

// wgmma's stages: the cp.async stores into the 128-byte swizzled layouts (8 consecutive chunks of
// a K-major row, or of an MN-major atom's k row, on the 32 banks). wgmma's own reads are not
// counted: the hardware reads the canonical layouts as a whole.
TEST(Lowering, WgmmaStagesHaveNoBankConflicts) {
  const Target base = testing::with_matmul(cuda::device_target(testing::fake_runtime()), "bf16-mma=on,wgmma=on");
  for (const MmaTilingCase& t : kWgmmaTilings) {
    SCOPED_TRACE(std::string(t.tile) + ", " + t.stages + " stages");
    expect_no_mma_bank_conflicts(t.on(base), true, "wgmma m64n");
  }
}

// Printed for docs/BENCHMARKS.md, not asserted: kernel-IR instructions a thread executes in the
// bf16 mma kernel, per k step of the main loop and outside it (address setup, the pipeline's
// first stages, the epilogue), for a GPT-like fused product (bias and GELU) of 256 x 256 x K
// whose blocks all lie inside c. A step's count is the difference between K = 768 and K = 736.
TEST(Lowering, Bf16MmaInstructionsPerThread) {
  auto executed = [](const Target& target, int64_t k) {  // by all threads of all blocks
    testing::Harness h({f32({256, k}), f32({256, k}), f32({256})}, [](Builder& bld, const std::vector<ValueId>& x) {
      ValueId y = bld.matmul(bld.cast(x[0], DType::bf16), bld.cast(x[1], DType::bf16), false, true);
      return bld.pointwise(se::gelu(se::in(0)), {bld.add(y, x[2])});
    });
    std::vector<ValueId> outs{h.output};
    Circuit fused = fuse_matmul(h.circuit, outs, target);  // renumbers outs: before they are passed on
    cuda::DeviceProgram dp(std::move(fused), outs, testing::fake_runtime(), target);
    cuda::fake_driver_count_bank_conflicts(true);
    dp.run(h.bindings);
    const auto stats = cuda::fake_driver_kernel_stats();
    cuda::fake_driver_count_bank_conflicts(false);
    for (const auto& [name, s] : stats)
      if (name.find("matmul") != std::string::npos) return static_cast<double>(s.instructions);
    ADD_FAILURE() << "no matmul kernel ran";
    return 0.0;
  };
  // One tiling's counts: a k step's from K = 768 and K = 768 - tile_k, the rest outside the loop.
  auto report = [&](const char* kernel, const MmaTilingCase& t, const Target& target, int64_t tile_k) {
    const double tn = std::string(t.tile) == "128x256" ? 256 : 128, threads = 256 * (256.0 * 256.0 / (128 * tn));
    const double full = executed(target, 768) / threads, step = full - executed(target, 768 - tile_k) / threads;
    std::printf(
        "bf16 %s %s, %s stages: %.0f instructions a thread per k step of %lld, %.0f outside the loop (K = 768: "
        "%.0f)\n",
        kernel, t.tile, t.stages, step, static_cast<long long>(tile_k), full - static_cast<double>(768 / tile_k) * step,
        full);
  };
  const Target base = testing::with_matmul(cuda::device_target(testing::fake_runtime()), "bf16-mma=on");
  for_each_mma_tiling(base, [&](const MmaTilingCase& t, const Target& target) { report("mma", t, target, 32); });
  // wgmma: k steps of 64, its products one instruction a k16 slice a warpgroup.
  for (const MmaTilingCase& t : kWgmmaTilings) report("wgmma", t, t.on(base, "wgmma=on"), 64);
}

}  // namespace
}  // namespace kiln
