// Kernel-count guards and step statistics. Guards: how many kernels a GPT's forward, backward and AdamW steps launch
// once lowered for the GPU, with every fusion pass on. Each guard is the count measured when the pass that earned it
// landed, so a regression in fusion fails here; lower a guard when a new pass lowers the count. The targets: a
// block's forward <= 9 (met with matmul fusion), forward + backward <= 28 (met: 27), AdamW 1 (met), 2 with clipping
// (met), a 4-layer step <= 124 (met); the counts print so that a regression is visible.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/step_stats.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>

#include "device_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

enum class Part { Forward, ForwardBackward, AdamW, Step };

size_t launches_of(const Plan& plan) {
  size_t n = 0;
  const Circuit& c = plan.program->circuit();
  for (size_t i = 0; i < c.ops().size(); ++i) n += cuda::lower(c, static_cast<int>(i), plan.target).launches.size();
  return n;
}

// Launches of one realization of `part` for a GPT of `layers` blocks (tiny widths, no
// dropout, gradient clipping at `clip` unless 0; with `guarded`, AdamW skips non-finite steps
// as the Trainer's does): the plan of its last realization, made for a (fake) sm_90 GPU on the
// CPU, the plan a GPU run gets; nothing runs there.
// (With `stats`, also the plan's step statistics.)
size_t launches(int64_t layers, Part part, double clip = 1.0, bool guarded = false,
                Precision precision = Precision::f32, StepStats* stats = nullptr) {
  ScopedPrecision policy(precision);
  models::GPTConfig cfg = testing::tiny_gpt_config(layers);
  cfg.dropout = 0;
  manual_seed(5);
  models::GPT model(cfg);
  optim::AdamWOptions adamw;
  adamw.skip_non_finite = guarded;
  optim::AdamW opt(model.parameters(), adamw);
  Tensor x = Tensor::from_host(HostTensor::zeros(DType::i32, Shape{2, 8}));
  Engine& engine = Engine::current();
  testing::ScopedTarget gpu([](Target& t) { t = with_device_of(t, cuda_target(90, /*fake=*/true)); });
  Tensor loss = model.loss(x, x);
  if (part != Part::Forward) loss.backward();
  if (part == Part::AdamW) engine.realize();  // the update alone, in a realization of its own
  if (part == Part::AdamW || part == Part::Step) opt.step(clip, part == Part::Step ? loss : Tensor());
  engine.realize();
  const Plan* plan = engine.last_plan();
  const size_t n = plan ? launches_of(*plan) : 0;
  if (stats && plan) *stats = measure_step(*plan);
  return n;
}

TEST(KernelCounts, GptBlockForwardBackwardAdamWAndStep) {
  const size_t f1 = launches(1, Part::Forward), f2 = launches(2, Part::Forward);
  const size_t fb1 = launches(1, Part::ForwardBackward), fb2 = launches(2, Part::ForwardBackward);
  const size_t adamw = launches(4, Part::AdamW), adamw_unclipped = launches(4, Part::AdamW, 0.0);
  const size_t adamw_guarded = launches(4, Part::AdamW, 0.0, true);
  const size_t step4 = launches(4, Part::Step), step4_guarded = launches(4, Part::Step, 1.0, true);
  std::printf(
      "kernels: block forward %zu, block forward+backward %zu, AdamW (4 layers) %zu (%zu without clipping, %zu "
      "unclipped skipping non-finite steps), 4-layer step %zu (%zu skipping non-finite steps, as the Trainer)\n",
      f2 - f1, fb2 - fb1, adamw, adamw_unclipped, adamw_guarded, step4, step4_guarded);
  // The counts as measured on main: forward 7, forward and backward 21, AdamW 2 with clipping (1
  // without), the 4-layer step 100; a change that adds launches fails here.
  EXPECT_LE(f2 - f1, 7u);          // LN, QKV, attention, projection, LN, fc, projection
  EXPECT_LE(fb2 - fb1, 21u);       // measured 21
  EXPECT_LE(adamw, 2u);            // the target
  EXPECT_EQ(adamw_unclipped, 1u);  // the target: every parameter's update in one launch
  EXPECT_LE(step4, 100u);          // measured 100
  // Skipping non-finite steps tests the norm and the loss inside the update's launches.
  EXPECT_LE(adamw_guarded, adamw);
  EXPECT_LE(step4_guarded, step4);
}

// --recompute auto on the GPU (not its default: untimed there) costs launches: a recomputed layer
// norm output is a kernel of its own, and in bf16 so are the casts of the recomputed values to
// bf16 (the GELU output's, f32, becomes a prologue of the product that reads it). Measured: one
// a block in f32, three in bf16; a change that adds more fails here.
TEST(KernelCounts, AutoRecomputationCostsALaunchABlockInF32AndThreeInBf16) {
  for (Precision precision : {Precision::f32, Precision::bf16}) {
    size_t none = 0, automatic = 0;
    {
      testing::ScopedPipeline mode(testing::recompute(RecomputeMode::none));
      none = launches(4, Part::Step, 1.0, false, precision);
    }
    {
      testing::ScopedPipeline mode(testing::recompute(RecomputeMode::automatic));
      automatic = launches(4, Part::Step, 1.0, false, precision);
    }
    std::printf("4-layer %s step: %zu launches keeping every saved value, %zu with --recompute auto\n",
                precision_name(precision), none, automatic);
    EXPECT_LE(automatic, none + (precision == Precision::f32 ? 4u : 12u)) << precision_name(precision);
  }
}

// --precision bf16: the matmuls' operands that row kernels, matmul epilogues and attention
// produce are written as bf16 by those ops, not by cast kernels: per block the two norms' outputs
// and their input gradients (the next matmuls' dY), the GELU output and its gradient, the
// attention output and the QKV gradient; plus the final norm's forward and backward and the
// loss's gradient, less the first norm's backward (the embedding's gradient takes no cast). The loss's gradient (rows
// of the vocabulary, 65: not 16-byte rows of bf16) is also written padded by the loss's row kernel (absorb_padding),
// where a concat copied it into padded rows, with zeros from a fill and its cast: 3 launches.
TEST(KernelCounts, Bf16MatmulOperandsAreWrittenByTheirProducers) {
  const size_t all = launches(2, Part::Step, 1.0, false, Precision::bf16);
  auto without = [](const char* pass) {
    testing::ScopedPipeline off(std::string("-") + pass);
    return launches(2, Part::Step, 1.0, false, Precision::bf16);
  };
  const size_t without_padding = without("absorb_padding"), without_casts = without("absorb_casts");
  std::printf("2-layer bf16 step: %zu launches, %zu without absorb_padding, %zu without absorb_casts\n", all,
              without_padding, without_casts);
  EXPECT_EQ(without_padding - all, 3u);
  // Without absorb_casts the concat reads a cast kernel's output, which absorb_padding leaves.
  EXPECT_EQ(without_casts - all, 2u * 8u + 2u + 3u);
}

// --precision bf16: the c_fc bias gradient (the column sums of the MLP's GELU gradient, which
// the c_proj input-gradient product makes) is summed by that product in 128-row blocks
// (matmul_column_sums): the f32 GELU gradient (2 sequences x 8 tokens x 64 a layer here) is
// neither written nor read back; a row of block sums a sequence (the product's batch) is, and
// the launches stay.
TEST(KernelCounts, Bf16BiasGradientsOfMatmulEpiloguesAreSummedByTheMatmul) {
  StepStats with, without;
  const size_t all = launches(2, Part::Step, 1.0, false, Precision::bf16, &with);
  size_t off = 0;
  {
    testing::ScopedPipeline disable("-matmul_column_sums");
    off = launches(2, Part::Step, 1.0, false, Precision::bf16, &without);
  }
  EXPECT_EQ(all, off);
  const double per_layer = (16 - 2) * 64 * 4;  // tokens less the block sums' two rows, x hidden x f32
  std::printf("2-layer bf16 step: %.0f bytes written (%.0f without matmul_column_sums), %.0f read (%.0f)\n",
              with.bytes_written, without.bytes_written, with.bytes_read, without.bytes_read);
  EXPECT_EQ(without.bytes_written - with.bytes_written, 2 * per_layer);
  EXPECT_EQ(without.bytes_read - with.bytes_read, 2 * per_layer);
}

TEST(KernelCounts, EachPassLowersTheStepAndTheSwitchTurnsPassesOff) {
  const size_t all = launches(1, Part::Step);
  std::map<std::string, size_t> without;
  std::string every_pass;
  // Every pass of the pipeline but cse (a GPT step records no duplicate work for it to find),
  // pad_bf16_rows (a layout pass: it adds a concat where it pads; an f32 step has no bf16 casts)
  // and absorb_casts, absorb_padding and matmul_column_sums (no bf16 casts, padding or stored
  // epilogue summed in an f32 step either; tested above in bf16), and bf16_as_rounded_f32,
  // chunk_loss_head and overlap_collectives (the CPU's: they leave GPU plans as they are;
  // tests/test_bf16_as_rounded_f32.cpp, tests/test_chunk_loss_head.cpp, tests/test_overlap_collectives.cpp).
  for (const PassInfo& p : pipeline_passes()) {
    const std::string pass = p.name;
    if (pass == "cse") continue;
    every_pass += (every_pass.empty() ? "-" : ",-") + pass;
    if (pass == "pad_bf16_rows" || pass == "absorb_casts" || pass == "absorb_padding" || pass == "matmul_column_sums" ||
        pass == "bf16_as_rounded_f32" || pass == "chunk_loss_head" || pass == "overlap_collectives")
      continue;
    {
      testing::ScopedPipeline off("-" + pass);
      without[pass] = launches(1, Part::Step);
    }
    EXPECT_GT(without[pass], all) << "switching off " << pass << " should cost launches";
  }
  size_t none = 0;
  {
    testing::ScopedPipeline off(every_pass);
    none = launches(1, Part::Step);
  }
  std::printf(
      "1-layer step: %zu launches with every pass, %zu without fusion (simplify_row_indexing off: %zu, fuse_attention "
      "off: %zu, fuse_pointwise "
      "off: %zu, fuse_columns off: %zu, fuse_matmul off: %zu, fuse_rows off: %zu, forward_assigns off: %zu, "
      "merge_multi_tensor off: %zu)\n",
      all, none, without["simplify_row_indexing"], without["fuse_attention"], without["fuse_pointwise"],
      without["fuse_columns"], without["fuse_matmul"], without["fuse_rows"], without["forward_assigns"],
      without["merge_multi_tensor"]);
  EXPECT_LT(all, none);
}

size_t float_atomics(const std::vector<kir::Stmt>& body) {
  size_t n = 0;
  for (const kir::Stmt& st : body) {
    if (st.kind == kir::Stmt::Kind::Instr)
      n += st.instr.op == kir::Opc::AtomAdd && st.instr.type == kir::Type::f32 ? 1 : 0;
    n += float_atomics(st.body) + float_atomics(st.else_body);
  }
  return n;
}

// Deterministic mode: no kernel of a GPT training step adds floats atomically (the embedding
// gradient's scatter sums in source order), so the step's bits do not depend on scheduling.
TEST(DeterministicMode, AGptStepHasNoFloatAtomics) {
  Engine& engine = Engine::current();
  size_t atomics[2] = {0, 0};
  for (bool deterministic : {false, true}) {
    engine.set_deterministic(deterministic);
    launches(1, Part::Step);
    const Plan* plan = engine.last_plan();
    ASSERT_NE(plan, nullptr);
    EXPECT_EQ(plan->target.deterministic, deterministic);
    const Circuit& c = plan->program->circuit();
    for (size_t i = 0; i < c.ops().size(); ++i)
      for (const cuda::Launch& l : cuda::lower(c, static_cast<int>(i), plan->target).launches)
        atomics[deterministic] += float_atomics(l.kernel->body);
  }
  engine.set_deterministic(false);
  EXPECT_GT(atomics[0], 0u);  // the token and position embeddings' gradients, by default
  EXPECT_EQ(atomics[1], 0u);
}

// measure_step on a hand-made plan: phases, bytes, and the peak of live intermediates (an
// alias shares its source's storage; a value is freed after its last reader).
TEST(StepStats, CountsPhasesBytesAndPeakMemory) {
  Circuit c;
  ValueId x = c.add_external({Shape{4}, DType::f32}, ValueRole::Input, "x");
  ValueId w = c.add_external({Shape{4}, DType::f32}, ValueRole::Persistent, "w");
  Builder b(c);
  ValueId a = b.pointwise(se::exp(se::in(0)), {x});  // 16 B, live until d
  ValueId r = b.reshape(a, Shape{2, 2});             // alias of a
  c.set_recording_phase(Phase::Backward);
  ValueId d = b.scale(b.reshape(r, Shape{4}), 2.0);  // 16 B: a and d live together (32 B)
  c.set_recording_phase(Phase::Update);
  ValueId e = b.add(d, w);  // 16 B: d and e (32 B); a already freed
  b.assign(w, e);
  Plan plan;
  plan.program = std::make_unique<Program>(c, std::vector<ValueId>{e});
  StepStats s = measure_step(plan);
  EXPECT_EQ(s.ops[static_cast<size_t>(Phase::Forward)], 1u);
  EXPECT_EQ(s.ops[static_cast<size_t>(Phase::Recompute)], 0u);
  EXPECT_EQ(s.ops[static_cast<size_t>(Phase::Backward)], 1u);
  EXPECT_EQ(s.ops[static_cast<size_t>(Phase::Update)], 1u);  // the assign is an alias, not work
  EXPECT_TRUE(s.lowered);
  EXPECT_EQ(s.launches[0] + s.launches[1] + s.launches[2] + s.launches[3], 3u);
  EXPECT_EQ(s.saved_bytes, 16u);  // a, which the backward reads through the reshape
  EXPECT_EQ(s.peak_intermediate_bytes, 32u);
  EXPECT_EQ(s.bytes_read, 16.0 * 4);     // x, a, d, w
  EXPECT_EQ(s.bytes_written, 16.0 * 3);  // a, d, e
  EXPECT_EQ(s.persistent_bytes, 16u);
  EXPECT_EQ(s.input_bytes, 16u);
}

}  // namespace
}  // namespace kiln
