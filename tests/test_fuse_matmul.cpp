// T2 for matmul fusion: a transformer block's forward and backward, and random compositions of
// operand chains (splits, slices, permutes, broadcasts, unary pointwise ops, a reshape that is
// no view) with epilogues (bias, GELU with its pre-activation kept, residual, permuted store),
// give the unfused results on the Eigen executor (f64 1e-12, f32 1e-5 norm-relative: the
// reference gathers operands and sums in another order) and in the SIMT simulator (f32 1e-5;
// K <= 64, FFMA, tanh within 2 ulp); moves in front of a matmul disappear where the view is
// affine and stay where it is not; legality: no read through a buffer an assign overwrites,
// no epilogue that a path around the group reaches, no epilogue from another phase.
#include <gtest/gtest.h>

#include <cmath>

#include <kiln/ad/backward.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/circuit/prims/philox.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"

namespace kiln {
namespace {

using testing::Built;

size_t moves(const Circuit& c) {
  size_t n = 0;
  for (PrimId p : {PrimId::permute, PrimId::split, PrimId::slice, PrimId::broadcast}) n += testing::count_prim(c, p);
  return n;
}

// Fused (cse, fuse_pointwise, fuse_matmul[, fuse_rows]) and unfused (cse, fuse_pointwise)
// circuits of `u` agree on the Eigen executor and, in f32, in the simulator. Returns the fused.
Circuit expect_fused_matches(const Built& u, DType dt, bool with_rows, const std::string& what) {
  std::vector<ValueId> plain_outs = u.outs, fused_outs = u.outs;
  Circuit plain = fuse_pointwise(cse(u.c, plain_outs), plain_outs);
  Circuit fused = fuse_matmul(fuse_pointwise(cse(u.c, fused_outs), fused_outs), fused_outs, cpu_target());
  if (with_rows) fused = fuse_rows(fused, fused_outs);
  auto fresh = [&] { return u.fresh_binds(); };
  auto want = execute(plain, fresh(), plain_outs), got = execute(fused, fresh(), fused_outs);
  for (size_t o = 0; o < want.size(); ++o)
    EXPECT_LT(testing::relative_error(got[o], want[o]), dt == DType::f64 ? 1e-12 : 1e-5)
        << what << " output " << o << "\n"
        << fused.dump("fused");
  if (dt == DType::f32) {
    auto sim = cuda::DeviceProgram(fused, fused_outs, testing::fake_runtime()).run(fresh());
    for (size_t o = 0; o < want.size(); ++o)
      EXPECT_LT(testing::relative_error(sim[o], want[o]), 1e-5) << what << " output " << o << " (simulator)";
  }
  return fused;
}

// A GPT block without layernorms (the row fusion's tests cover those): attention with a causal
// softmax, the projections with biases and residuals, the GELU MLP; loss = sum(out * r); the
// outputs are the block's output and the gradients of x and every weight.
Built attention_mlp_block(DType dt) {
  const int64_t B = 2, T = 7, C = 12, H = 3, hs = C / H;
  Built u;
  ValueId x = u.input({B, T, C}, dt, 1);
  std::vector<ValueId> w;
  const std::vector<Shape> shapes = {{3 * C, C}, {3 * C}, {C, C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
  for (size_t i = 0; i < shapes.size(); ++i) w.push_back(u.input(shapes[i], dt, 10 + i, ValueRole::Persistent));
  ValueId r = u.input({B, T, C}, dt, 30);
  Builder b(u.c, "block");
  auto linear = [&](ValueId v, size_t k) { return b.add(b.matmul(v, w[k], false, true), w[k + 1]); };
  std::vector<ValueId> qkv = b.split(linear(x, 0), 2, {C, C, C});
  auto heads = [&](ValueId y) { return b.permute(b.reshape(y, Shape{B, T, H, hs}), {0, 2, 1, 3}); };
  ValueId q = b.scale(heads(qkv[0]), 1.0 / std::sqrt(static_cast<double>(hs)));
  ValueId att = composite::softmax(b, composite::apply_causal_mask(b, b.matmul(q, heads(qkv[1]), false, true)));
  ValueId y = b.reshape(b.permute(b.matmul(att, heads(qkv[2])), {0, 2, 1, 3}), Shape{B, T, C});
  ValueId x1 = b.add(x, linear(y, 2));
  ValueId out = b.add(x1, linear(b.pointwise(se::gelu(se::in(0)), {linear(x1, 4)}), 6));
  u.c.set_recording_phase(Phase::Backward);
  std::vector<ValueId> wrt = {x};
  wrt.insert(wrt.end(), w.begin(), w.end());
  u.outs = ad::backward(b, b.reduce_all(ReduceKind::Sum, b.mul(out, r)), wrt);
  u.outs.insert(u.outs.begin(), out);
  return u;
}

TEST(FuseMatmul, ABlockForwardAndBackwardGiveTheUnfusedResults) {
  for (DType dt : {DType::f64, DType::f32}) {
    Built u = attention_mlp_block(dt);
    Circuit f = expect_fused_matches(u, dt, true, "block");
    // 6 forward, 12 backward; the one left plain (the gradient reaching the attention's output
    // projection input: its operands are read as they are, its readers read it through views)
    // gains nothing from fusion.
    EXPECT_EQ(testing::count_prim(f, PrimId::fused_matmul), 17u) << f.dump("fused");
    EXPECT_EQ(testing::count_prim(f, PrimId::matmul), 1u) << f.dump("fused");
    // The heads' split and permutes, the output permute and the gradients' permutes are all
    // addressing now; the gradient of the split (a concat) is what remains of the moves.
    EXPECT_EQ(moves(f), 0u) << f.dump("fused");
    EXPECT_EQ(testing::count_prim(f, PrimId::concat), 1u);
    // The four bias gradients are row sums in their weight gradients' kernels.
    EXPECT_EQ(testing::count_prim(f, PrimId::reduce), 0u) << f.dump("fused");
  }
}

// Operand chains for a (2, 3, R, K) operand; each builds the operand from fresh inputs.
// Every chain but "reinterpreted" is an affine view of its input.
struct Chain {
  std::string name;
  bool affine;
  std::function<ValueId(Built&, Builder&, const Shape&, DType, uint64_t)> build;
};

std::vector<Chain> chains() {
  return {
      {"input", true, [](Built& u, Builder&, const Shape& s, DType dt, uint64_t seed) { return u.input(s, dt, seed); }},
      {"split_reshape_permute", true,
       [](Built& u, Builder& b, const Shape& s, DType dt, uint64_t seed) {
         ValueId e = u.input({s[0], s[2], 2 * s[1] * s[3]}, dt, seed);
         ValueId piece = b.split(e, 2, {s[1] * s[3], s[1] * s[3]})[1];
         return b.permute(b.reshape(piece, Shape{s[0], s[2], s[1], s[3]}), {0, 2, 1, 3});
       }},
      {"slice_transposed_tanh", true,
       [](Built& u, Builder& b, const Shape& s, DType dt, uint64_t seed) {
         ValueId e = u.input({s[0], s[1], s[3], s[2] + 2}, dt, seed);
         ValueId t = b.permute(b.slice(e, 3, 1, s[2] + 1), {0, 1, 3, 2});
         return b.pointwise(se::tanh(se::in(0)), {t});
       }},
      {"broadcast_batch", true,
       [](Built& u, Builder& b, const Shape& s, DType dt, uint64_t seed) {
         return b.broadcast(u.input({s[1], s[2], s[3]}, dt, seed), s);
       }},
      {"reinterpreted", false,
       [](Built& u, Builder& b, const Shape& s, DType dt, uint64_t seed) {
         // A transposed copy read back in the original shape: no view of the input.
         ValueId e = u.input({s[0], s[1], s[2], s[3]}, dt, seed);
         return b.reshape(b.permute(e, {0, 1, 3, 2}), s);
       }},
  };
}

enum class Epilogue { None, Bias, BiasGeluKeepingPreActivation, ResidualPermuted };

TEST(FuseMatmul, RandomOperandChainsAndEpiloguesGiveTheUnfusedResults) {
  const std::vector<Chain> all = chains();
  const int64_t R = 5, N = 9, K = 7;  // R, K coprime: "reinterpreted" cannot be a view
  uint64_t state = 17;
  size_t fused_views = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const uint64_t bits = philox_bits(state, 0, static_cast<uint64_t>(trial));
    const Chain& ca = all[bits % all.size()];
    const Chain& cb = all[(bits >> 8) % all.size()];
    const auto epi = static_cast<Epilogue>((bits >> 16) % 4);
    const DType dt = trial % 3 == 0 ? DType::f32 : DType::f64;
    Built u;
    Builder b(u.c, "t");
    ValueId a = ca.build(u, b, Shape{2, 3, R, K}, dt, 100 + static_cast<uint64_t>(trial) * 10);
    ValueId w = cb.build(u, b, Shape{2, 3, N, K}, dt, 105 + static_cast<uint64_t>(trial) * 10);
    ValueId y = b.matmul(a, w, false, true);  // (2, 3, R, N)
    switch (epi) {
      case Epilogue::None: u.outs = {y}; break;
      case Epilogue::Bias: u.outs = {b.add(y, u.input({N}, dt, 7))}; break;
      case Epilogue::BiasGeluKeepingPreActivation: {
        ValueId pre = b.add(y, u.input({N}, dt, 7));
        u.outs = {pre, b.pointwise(se::gelu(se::in(0)), {pre})};
        break;
      }
      case Epilogue::ResidualPermuted:
        u.outs = {b.permute(b.add(y, u.input({2, 3, R, N}, dt, 8)), {0, 2, 1, 3})};
        break;
    }
    const std::string what = "a " + ca.name + ", b " + cb.name + ", epilogue " + std::to_string(static_cast<int>(epi));
    Circuit f = expect_fused_matches(u, dt, false, what);
    EXPECT_EQ(testing::count_prim(f, PrimId::matmul) + testing::count_prim(f, PrimId::fused_matmul), 1u) << what;
    EXPECT_EQ(testing::count_prim(f, PrimId::pointwise), 0u) << what << "\n" << f.dump();  // all prologues, epilogues
    EXPECT_EQ(moves(f), static_cast<size_t>(!ca.affine) + static_cast<size_t>(!cb.affine)) << what << "\n" << f.dump();
    fused_views += ca.affine && ca.name != "input";
  }
  EXPECT_GE(fused_views, 8u);  // the seed exercises the views, not only plain inputs
}

// A residual add a layernorm reads is left to the row fusion, which computes it inside the
// layernorm's row kernel; as an epilogue it would only be written and read back.
TEST(FuseMatmul, AValueOfARowPatternIsLeftToTheRowFusion) {
  Built u;
  ValueId x = u.input({6, 8}, DType::f32, 1);
  ValueId w = u.input({8, 16}, DType::f32, 2);
  ValueId res = u.input({6, 16}, DType::f32, 3);
  ValueId gamma = u.input({16}, DType::f32, 4), beta = u.input({16}, DType::f32, 5);
  Builder b(u.c, "t");
  u.outs = {composite::layernorm(b, b.add(b.matmul(x, w), res), gamma, beta)};
  Circuit f = expect_fused_matches(u, DType::f32, true, "residual layernorm");
  EXPECT_EQ(testing::count_prim(f, PrimId::matmul) + testing::count_prim(f, PrimId::fused_matmul), 1u) << f.dump();
  EXPECT_EQ(testing::count_prim(f, PrimId::fused_rows), 1u) << f.dump();
  EXPECT_EQ(testing::count_prim(f, PrimId::fused_matmul), 0u) << "no epilogue taken from the layernorm\n" << f.dump();
}

TEST(FuseMatmul, ABufferAnAssignOverwritesIsNotReadThrough) {
  Built u;
  ValueId x = u.input({4, 6}, DType::f64, 1);
  ValueId w = u.input({5, 6}, DType::f64, 2, ValueRole::Persistent);
  Builder b(u.c, "t");
  ValueId wt = b.permute(w, {1, 0});  // (6, 5)
  ValueId y = b.matmul(x, wt);
  b.assign(w, b.scale(w, 0.5));
  u.outs = {y};
  Circuit f = expect_fused_matches(u, DType::f64, false, "assigned");
  EXPECT_EQ(testing::count_prim(f, PrimId::permute), 1u) << f.dump();
}

TEST(FuseMatmul, AnEpilogueAPathAroundTheGroupReachesStaysOut) {
  Built u;
  ValueId x = u.input({4, 6}, DType::f64, 1);
  ValueId w = u.input({6, 5}, DType::f64, 2);
  Builder b(u.c, "t");
  ValueId y = b.matmul(x, w);
  ValueId s = b.reduce(ReduceKind::Max, y, 1);  // (4, 1): depends on y
  u.outs = {b.pointwise(se::exp(se::in(0) - se::in(1)), {y, s})};
  Circuit f = expect_fused_matches(u, DType::f64, false, "cycle");
  EXPECT_EQ(testing::count_prim(f, PrimId::pointwise), 1u) << f.dump();
}

TEST(FuseMatmul, ABackwardReaderOfAForwardProductIsNoEpilogue) {
  Built u;
  ValueId x = u.input({4, 6}, DType::f64, 1);
  ValueId w = u.input({6, 5}, DType::f64, 2);
  ValueId g = u.input({4, 5}, DType::f64, 3);
  Builder b(u.c, "t");
  ValueId y = b.matmul(x, w);
  u.c.set_recording_phase(Phase::Backward);
  u.outs = {y, b.mul(y, g)};
  Circuit f = expect_fused_matches(u, DType::f64, false, "phases");
  EXPECT_EQ(testing::count_prim(f, PrimId::pointwise), 1u) << f.dump();
  EXPECT_EQ(testing::count_prim(f, PrimId::matmul), 1u) << "nothing to gain: the matmul stays\n" << f.dump();
}

}  // namespace
}  // namespace kiln
