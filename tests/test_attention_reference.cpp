// Reference semantics of attention and attention_grad (circuit/prims/attention.cpp) against
// plain loops written from the definitions: scores, a softmax per row, its Jacobian for the
// backward (the Prim uses the identity rowsum(p * dp) = rowsum(do * o) instead, so the loops
// check that too), in f64 and f32.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

#include "prim_test_util.hpp"

namespace kiln {
namespace {

struct Sizes {
  int64_t entries, tq, tk, d, dv;
};

HostTensor rnd(DType dt, Shape s, uint64_t seed) {
  return testing::random_tensor(testing::InputSpec{std::move(s), dt, -1.5, 1.5}, seed);
}

// The probabilities of every entry by loops: [entry][i][j].
std::vector<std::vector<std::vector<double>>> probabilities(const Sizes& z, const HostTensor& q, const HostTensor& k,
                                                            bool causal, double scale) {
  std::vector<std::vector<std::vector<double>>> p(static_cast<size_t>(z.entries));
  for (int64_t e = 0; e < z.entries; ++e)
    for (int64_t i = 0; i < z.tq; ++i) {
      std::vector<double> s(static_cast<size_t>(z.tk), -std::numeric_limits<double>::infinity());
      double m = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t j = 0; j < z.tk; ++j) {
        if (causal && j > i) continue;
        double dot = 0;
        for (int64_t c = 0; c < z.d; ++c) dot += q.get((e * z.tq + i) * z.d + c) * k.get((e * z.tk + j) * z.d + c);
        s[static_cast<size_t>(j)] = scale * dot;
        m = std::max(m, scale * dot);
      }
      for (double& x : s) sum += x = std::exp(x - m);
      for (double& x : s) x /= sum;
      p[static_cast<size_t>(e)].push_back(s);
    }
  return p;
}

double max_abs_diff(const HostTensor& got, const std::vector<double>& want) {
  double worst = 0;
  EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < got.numel(); ++i)
    worst = std::max(worst, std::abs(got.get(i) - want[static_cast<size_t>(i)]));
  return worst;
}

void check_attention(DType dt, bool causal, double tolerance, int64_t tq = 5) {
  const Sizes z{6, tq, causal ? tq : 7, 3, 4};
  const double scale = 0.8;
  Circuit c;
  ValueId q = c.add_external({Shape{2, 3, z.tq, z.d}, dt}, ValueRole::Input);
  ValueId k = c.add_external({Shape{2, 3, z.tk, z.d}, dt}, ValueRole::Input);
  ValueId v = c.add_external({Shape{2, 3, z.tk, z.dv}, dt}, ValueRole::Input);
  ValueId d_o = c.add_external({Shape{2, 3, z.tq, z.dv}, dt}, ValueRole::Input);
  ValueId dlse = c.add_external({Shape{2, 3, z.tq, 1}, dt}, ValueRole::Input);
  const Params params = AttentionParams{causal, scale}.to_params();
  std::vector<ValueId> f = c.add_op(PrimId::attention, params, {q, k, v});
  std::vector<ValueId> g = c.add_op(PrimId::attention_grad, params, {q, k, v, f[0], f[1], d_o, dlse});
  const std::vector<HostTensor> in = {rnd(dt, c.info(q).shape, 1), rnd(dt, c.info(k).shape, 2),
                                      rnd(dt, c.info(v).shape, 3), rnd(dt, c.info(d_o).shape, 4),
                                      rnd(dt, c.info(dlse).shape, 5)};
  const std::vector<HostTensor> out = execute(c, in, {f[0], f[1], g[0], g[1], g[2]});
  const auto p = probabilities(z, in[0], in[1], causal, scale);

  std::vector<double> o(static_cast<size_t>(z.entries * z.tq * z.dv)), lse,
      dq(static_cast<size_t>(z.entries * z.tq * z.d)), dk(static_cast<size_t>(z.entries * z.tk * z.d)),
      dv(static_cast<size_t>(z.entries * z.tk * z.dv));
  for (int64_t e = 0; e < z.entries; ++e)
    for (int64_t i = 0; i < z.tq; ++i) {
      const auto& pi = p[static_cast<size_t>(e)][static_cast<size_t>(i)];
      // lse from its definition: log of the sum of exp(s) over the keys the query sees.
      double sum = 0;
      for (int64_t j = 0; j < z.tk; ++j) {
        if (causal && j > i) continue;
        double dot = 0;
        for (int64_t cc = 0; cc < z.d; ++cc)
          dot += in[0].get((e * z.tq + i) * z.d + cc) * in[1].get((e * z.tk + j) * z.d + cc);
        sum += std::exp(scale * dot);
      }
      lse.push_back(std::log(sum));
      for (int64_t cc = 0; cc < z.dv; ++cc)
        for (int64_t j = 0; j < z.tk; ++j)
          o[static_cast<size_t>((e * z.tq + i) * z.dv + cc)] +=
              pi[static_cast<size_t>(j)] * in[2].get((e * z.tk + j) * z.dv + cc);
      // The softmax's Jacobian: ds_j = p_j (dp_j - sum_l p_l dp_l) + p_j dlse, dp_j = do . v_j.
      std::vector<double> dp(static_cast<size_t>(z.tk));
      double mean = 0;
      for (int64_t j = 0; j < z.tk; ++j) {
        for (int64_t cc = 0; cc < z.dv; ++cc)
          dp[static_cast<size_t>(j)] += in[3].get((e * z.tq + i) * z.dv + cc) * in[2].get((e * z.tk + j) * z.dv + cc);
        mean += pi[static_cast<size_t>(j)] * dp[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < z.tk; ++j) {
        const double pj = pi[static_cast<size_t>(j)];
        const double ds = pj * (dp[static_cast<size_t>(j)] - mean) + pj * in[4].get(e * z.tq + i);
        for (int64_t cc = 0; cc < z.d; ++cc) {
          dq[static_cast<size_t>((e * z.tq + i) * z.d + cc)] += scale * ds * in[1].get((e * z.tk + j) * z.d + cc);
          dk[static_cast<size_t>((e * z.tk + j) * z.d + cc)] += scale * ds * in[0].get((e * z.tq + i) * z.d + cc);
        }
        for (int64_t cc = 0; cc < z.dv; ++cc)
          dv[static_cast<size_t>((e * z.tk + j) * z.dv + cc)] += pj * in[3].get((e * z.tq + i) * z.dv + cc);
      }
    }
  EXPECT_LT(max_abs_diff(out[0], o), tolerance) << "o";
  EXPECT_LT(max_abs_diff(out[1], lse), tolerance) << "lse";
  EXPECT_LT(max_abs_diff(out[2], dq), tolerance) << "dq";
  EXPECT_LT(max_abs_diff(out[3], dk), tolerance) << "dk";
  EXPECT_LT(max_abs_diff(out[4], dv), tolerance) << "dv";
}

// f64 to rounding; f32 within a few ulp of values of order 1 (sums of <= 7 terms).
TEST(PrimReferenceAttention, AttentionAndAttentionGradMatchPlainLoopsCausal) {
  check_attention(DType::f64, true, 1e-12);
  check_attention(DType::f32, true, 2e-6);
}

// Causal rows run in blocks (kCausalRows in attention.cpp): 70 queries are several blocks, the
// last one partial, whose dk and dv add up.
TEST(PrimReferenceAttention, AttentionAndAttentionGradMatchPlainLoopsCausalOverSeveralRowBlocks) {
  check_attention(DType::f64, true, 1e-12, 70);
}

TEST(PrimReferenceAttention, AttentionAndAttentionGradMatchPlainLoopsWithoutMask) {
  check_attention(DType::f64, false, 1e-12);
  check_attention(DType::f32, false, 2e-6);
}

// Heads inside ((B, T, H, d) operands, lse (B, H, T, 1)) gives the values of the plain layout on
// the permuted operands, bit for bit (the same sums in the same order).
TEST(PrimReferenceAttention, AttentionAndAttentionGradWithHeadsInsideMatchThePlainLayout) {
  Circuit c;
  Builder b(c);
  const Shape s{2, 6, 3, 4};  // (B, T, H, d)
  std::vector<ValueId> x;
  std::vector<HostTensor> in;
  for (uint64_t i = 0; i < 4; ++i) {
    x.push_back(c.add_external({s, DType::f64}, ValueRole::Input));
    in.push_back(rnd(DType::f64, s, 20 + i));
  }
  auto heads_out = [&](ValueId v) { return b.permute(v, {0, 2, 1, 3}); };
  const Params inside = AttentionParams{true, 0.7, true}.to_params(),
               plain = AttentionParams{true, 0.7, false}.to_params();
  std::vector<ValueId> fi = c.add_op(PrimId::attention, inside, {x[0], x[1], x[2]});
  std::vector<ValueId> gi = c.add_op(PrimId::attention_grad, inside, {x[0], x[1], x[2], fi[0], fi[1], x[3]});
  std::vector<ValueId> p = {heads_out(x[0]), heads_out(x[1]), heads_out(x[2]), heads_out(x[3])};
  std::vector<ValueId> fp = c.add_op(PrimId::attention, plain, {p[0], p[1], p[2]});
  std::vector<ValueId> gp = c.add_op(PrimId::attention_grad, plain, {p[0], p[1], p[2], fp[0], fp[1], p[3]});
  const std::vector<HostTensor> out = execute(c, in,
                                              {heads_out(fi[0]), fi[1], heads_out(gi[0]), heads_out(gi[1]),
                                               heads_out(gi[2]), fp[0], fp[1], gp[0], gp[1], gp[2]});
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_EQ(out[i].shape(), out[i + 5].shape()) << i;
    for (int64_t e = 0; e < out[i].numel(); ++e) ASSERT_EQ(out[i].get(e), out[i + 5].get(e)) << "output " << i;
  }
}

// Packed q, k, v ((B, T, 3 H d)) give the values of heads inside on the pieces, bit for bit, and
// the packed gradient holds dq, dk and dv side by side.
TEST(PrimReferenceAttention, AttentionAndAttentionGradPackedMatchHeadsInside) {
  Circuit c;
  Builder b(c);
  const int64_t batch = 2, t = 6, heads = 3, d = 4, width = heads * d;
  ValueId qkv = c.add_external({Shape{batch, t, 3 * width}, DType::f64}, ValueRole::Input);
  ValueId d_o = c.add_external({Shape{batch, t, heads, d}, DType::f64}, ValueRole::Input);
  const std::vector<HostTensor> in = {rnd(DType::f64, c.info(qkv).shape, 30), rnd(DType::f64, c.info(d_o).shape, 31)};
  const Params packed = AttentionParams{true, 0.7, true, heads}.to_params(),
               inside = AttentionParams{true, 0.7, true}.to_params();
  std::vector<ValueId> fp = c.add_op(PrimId::attention, packed, {qkv});
  std::vector<ValueId> gp = c.add_op(PrimId::attention_grad, packed, {qkv, fp[0], fp[1], d_o});
  std::vector<ValueId> pieces = b.split(qkv, 2, {width, width, width});
  for (ValueId& x : pieces) x = b.reshape(x, Shape{batch, t, heads, d});
  std::vector<ValueId> fi = c.add_op(PrimId::attention, inside, pieces);
  std::vector<ValueId> gi =
      c.add_op(PrimId::attention_grad, inside, {pieces[0], pieces[1], pieces[2], fi[0], fi[1], d_o});
  auto flat = [&](ValueId x) { return b.reshape(x, Shape{batch, t, width}); };
  ValueId gi_packed = b.concat({flat(gi[0]), flat(gi[1]), flat(gi[2])}, 2);
  const std::vector<HostTensor> out = execute(c, in, {fp[0], fp[1], gp[0], fi[0], fi[1], gi_packed});
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(out[i].shape(), out[i + 3].shape()) << i;
    for (int64_t e = 0; e < out[i].numel(); ++e) ASSERT_EQ(out[i].get(e), out[i + 3].get(e)) << "output " << i;
  }
}

// Grouped queries (kv_groups 2) give the values of the plain op on keys and values repeated for
// each query head, with dk and dv summed over the heads of a group (f64, to rounding).
TEST(PrimReferenceAttention, AttentionAndAttentionGradGroupedMatchRepeatedKeysAndValues) {
  Circuit c;
  Builder b(c);
  const int64_t batch = 2, heads = 4, kv_heads = 2, t = 6, d = 3;
  ValueId q = c.add_external({Shape{batch, heads, t, d}, DType::f64}, ValueRole::Input);
  ValueId k = c.add_external({Shape{batch, kv_heads, t, d}, DType::f64}, ValueRole::Input);
  ValueId v = c.add_external({Shape{batch, kv_heads, t, d}, DType::f64}, ValueRole::Input);
  ValueId d_o = c.add_external({Shape{batch, heads, t, d}, DType::f64}, ValueRole::Input);
  std::vector<HostTensor> in;
  for (ValueId x : {q, k, v, d_o}) in.push_back(rnd(DType::f64, c.info(x).shape, 50 + in.size()));
  const Params grouped = AttentionParams{true, 0.7, false, 0, heads / kv_heads}.to_params();
  const Params plain = AttentionParams{true, 0.7}.to_params();
  std::vector<ValueId> fg = c.add_op(PrimId::attention, grouped, {q, k, v});
  std::vector<ValueId> gg = c.add_op(PrimId::attention_grad, grouped, {q, k, v, fg[0], fg[1], d_o});
  auto repeat = [&](ValueId x) {
    const Shape g{batch, kv_heads, heads / kv_heads, t, d};
    return b.reshape(b.broadcast(b.reshape(x, Shape{batch, kv_heads, 1, t, d}), g), Shape{batch, heads, t, d});
  };
  auto group_sum = [&](ValueId x) {
    return b.reshape(b.reduce(ReduceKind::Sum, b.reshape(x, Shape{batch, kv_heads, heads / kv_heads, t, d}), 2),
                     Shape{batch, kv_heads, t, d});
  };
  std::vector<ValueId> fp = c.add_op(PrimId::attention, plain, {q, repeat(k), repeat(v)});
  std::vector<ValueId> gp = c.add_op(PrimId::attention_grad, plain, {q, repeat(k), repeat(v), fp[0], fp[1], d_o});
  const std::vector<HostTensor> out =
      execute(c, in, {fg[0], fg[1], gg[0], gg[1], gg[2], fp[0], fp[1], gp[0], group_sum(gp[1]), group_sum(gp[2])});
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_EQ(out[i].shape(), out[i + 5].shape()) << i;
    EXPECT_LT(testing::relative_error(out[i], out[i + 5]), 1e-12) << "output " << i;
  }
}

}  // namespace
}  // namespace kiln
