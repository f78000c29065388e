// T2 for attention as a Prim before differentiation (circuit/passes/fuse_attention.cpp): the
// attention chain becomes an attention op before the reverse sweep, whose VJP is attention_grad,
// with no (T, T) value left; fused and unfused circuits agree on the Eigen executor (f64 to
// rounding: 1e-12 norm-relative); variants the pattern does not cover stay unfused and still
// agree; recorded GPT and Llama steps (causal, grouped-query with rotary embeddings, non-causal)
// carry the fused ops in their plans, also when softmax's VJP is written another way, and the
// switch turns the rewrite off.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include <kiln/ad/backward.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/composites.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/layers/multi_head_attention.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/models/llama.hpp>

#include "device_test_util.hpp"
#include "prim_test_util.hpp"
#include "scoped_target.hpp"

namespace kiln {
namespace {

using testing::count_prim;

struct Variant {
  bool causal = true;
  int64_t tq = 13, tk = 13;
  bool backward = true;
  std::vector<int> wrt = {0, 1, 2};      // of q, k, v
  bool probabilities_out = false;        // the probabilities are an output too
  double dropout = 0;                    // on the probabilities (p)
  double q_scale = 0, scores_scale = 0;  // nonzero: q * q_scale, (q kᵀ) * scores_scale
  Shape mask{};                          // rank > 0: an additive mask of this shape on the scores
  bool mask_gradient = false;            // the mask is differentiated too
  bool bf16 = false;                     // f32 values, both products with bf16 operands (the
                                         // bf16 precision policy's casts)
};

struct Built {
  bool fuse = false;  // attention chains become attention ops before each differentiation
  Circuit c;
  std::vector<ValueId> outputs;
  std::vector<HostTensor> bindings;
};

// The gradients of `loss` for `wrt` as Engine::backward records them: with b.fuse the attention
// chains become attention ops first, keeping what is requested so far, the loss and wrt.
std::vector<ValueId> differentiate(Built& b, Builder& bl, ValueId loss, const std::vector<ValueId>& wrt) {
  if (b.fuse) {
    std::vector<ValueId> keep = b.outputs;
    keep.insert(keep.end(), wrt.begin(), wrt.end());
    keep.push_back(loss);
    fuse_attention_in_place(b.c, keep, wrt);
  }
  return ad::backward(bl, loss, wrt);
}

// q (2, 3, tq, 5), k (2, 3, tk, 5), v (2, 3, tk, 4), f64 (f32 with bf16 operands): y =
// softmax(mask(q kᵀ)) v, and the gradients of sum(y * r) for a fixed random r.
void record(const Variant& v, Built& b, Builder& bl) {
  const Shape qs{2, 3, v.tq, 5}, ks{2, 3, v.tk, 5}, vs{2, 3, v.tk, 4}, ys{2, 3, v.tq, 4};
  const DType dt = v.bf16 ? DType::f32 : DType::f64;
  std::vector<ValueId> x;
  uint64_t seed = 11;
  for (const Shape& s : {qs, ks, vs, ys}) {
    x.push_back(b.c.add_external({s, dt}, ValueRole::Input));
    b.bindings.push_back(testing::random_tensor({s, dt, -1.5, 1.5}, seed++));
  }
  // A product as the precision policy records it (core/tensor.cpp matmul).
  auto mm = [&](ValueId l, ValueId r, bool ta, bool tb) {
    if (v.bf16) l = bl.cast(l, DType::bf16), r = bl.cast(r, DType::bf16);
    return bl.matmul(l, r, ta, tb);
  };
  ValueId scores = mm(v.q_scale != 0 ? bl.scale(x[0], v.q_scale) : x[0], x[1], false, true);
  if (v.scores_scale != 0) scores = bl.scale(scores, v.scores_scale);
  ValueId mask = kNoValue;
  if (v.mask.rank() > 0) {
    mask = b.c.add_external({v.mask, dt}, ValueRole::Input);
    b.bindings.push_back(testing::random_tensor({v.mask, dt, -2, 2}, seed++));
    scores = bl.add(scores, mask);
  }
  if (v.causal) scores = composite::apply_causal_mask(bl, scores);
  ValueId p = composite::softmax(bl, scores);
  ValueId pd = p;
  if (v.dropout > 0) {
    ValueId key = b.c.add_external({Shape{2}, DType::i32}, ValueRole::Input);
    ValueId offset = b.c.add_external({Shape{}, DType::i32}, ValueRole::Input);
    HostTensor k = HostTensor::zeros(DType::i32, Shape{2}), o = HostTensor::zeros(DType::i32, Shape{});
    k.set(0, 7);
    b.bindings.push_back(k);
    b.bindings.push_back(o);
    pd = composite::dropout(bl, p, v.dropout, key, offset);
  }
  ValueId y = mm(pd, x[2], false, false);
  b.outputs = {y};
  if (v.probabilities_out) b.outputs.push_back(p);
  if (v.backward) {
    std::vector<ValueId> wrt;
    for (int i : v.wrt) wrt.push_back(x[static_cast<size_t>(i)]);
    if (v.mask_gradient) wrt.push_back(mask);
    for (ValueId g : differentiate(b, bl, bl.reduce_all(ReduceKind::Sum, bl.mul(y, x[3])), wrt)) b.outputs.push_back(g);
  }
}
Built build(const Variant& v, bool fuse) {
  Built b;
  b.fuse = fuse;
  Builder bl(b.c);
  record(v, b, bl);
  return b;
}

// Values of rank 4 whose last two dims are (tq, tk): the scores and probabilities.
size_t square_values(const Circuit& c, int64_t tq, int64_t tk) {
  size_t n = 0;
  for (const Op& op : c.ops())
    for (ValueId o : op.outputs) {
      const Shape& s = c.info(o).shape;
      n += s.rank() == 4 && s[2] == tq && s[3] == tk;
    }
  return n;
}

using Recorder = std::function<void(Built&, Builder&)>;

// A recording unfused (CSE only) and fused (the rewrite before differentiation, then CSE and the
// pipeline's pass for chains no backward followed), as plans of the recorded step see them.
struct Pair {
  Built plain, fused;
  Circuit plain_c, fused_c;
  std::vector<ValueId> plain_out, fused_out;
};
Pair record_both(const Recorder& rec) {
  Pair p;
  p.fused.fuse = true;
  for (Built* b : {&p.plain, &p.fused}) {
    Builder bl(b->c);
    rec(*b, bl);
  }
  p.plain_out = p.plain.outputs;
  p.plain_c = cse(p.plain.c, p.plain_out);
  p.fused_out = p.fused.outputs;
  p.fused_c = cse(p.fused.c, p.fused_out);
  p.fused_c = fuse_attention(p.fused_c, p.fused_out);
  return p;
}

// Returns the fused circuit after checking that both give the same values (shapes, and to f64
// rounding: 1e-12 norm-relative).
Circuit check_built_equivalent(const Recorder& rec, const std::string& what = {}) {
  const Pair p = record_both(rec);
  const std::vector<HostTensor> want = execute(p.plain_c, p.plain.bindings, p.plain_out);
  const std::vector<HostTensor> got = execute(p.fused_c, p.fused.bindings, p.fused_out);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].shape(), want[i].shape()) << what << " output " << i;
    if (got[i].shape() == want[i].shape()) {
      EXPECT_LT(testing::relative_error(got[i], want[i]), 1e-12) << what << " output " << i;
    }
  }
  return p.fused_c;
}
Circuit check_equivalent(const Variant& v) {
  return check_built_equivalent([&](Built& b, Builder& bl) { record(v, b, bl); });
}

TEST(FuseAttention, CausalForwardAndBackwardBecomeTwoOpsWithNoSquareValue) {
  const Circuit f = check_equivalent({});
  EXPECT_EQ(count_prim(f, PrimId::attention), 1u);
  EXPECT_EQ(count_prim(f, PrimId::attention_grad), 1u);
  EXPECT_EQ(count_prim(f, PrimId::matmul), 0u);
  EXPECT_EQ(square_values(f, 13, 13), 0u) << f.dump();
}

TEST(FuseAttention, UnmaskedAttentionOverMoreKeysThanQueries) {
  const Circuit f = check_equivalent({.causal = false, .tq = 7, .tk = 11});
  EXPECT_EQ(count_prim(f, PrimId::attention), 1u);
  EXPECT_EQ(count_prim(f, PrimId::attention_grad), 1u);
  EXPECT_EQ(square_values(f, 7, 11), 0u) << f.dump();
}

// A scale on q, on the scores, or both becomes the op's one scale.
TEST(FuseAttention, ScalesOnQAndOnTheScoresBecomeTheOpsScale) {
  const std::vector<Variant> scaled = {{.q_scale = 0.3},
                                       {.scores_scale = 0.45},
                                       {.causal = false, .tq = 7, .tk = 11, .scores_scale = 0.45},
                                       {.q_scale = 0.5, .scores_scale = 0.6},
                                       {.backward = false, .scores_scale = 0.45}};
  for (const Variant& v : scaled) {
    const Circuit f = check_equivalent(v);
    ASSERT_EQ(count_prim(f, PrimId::attention), 1u) << f.dump();
    // Both scales and their VJPs absorbed: the one pointwise op left is the loss's gradient (do).
    EXPECT_EQ(count_prim(f, PrimId::pointwise), v.backward ? 1u : 0u) << f.dump();
    for (const Op& op : f.ops()) {
      if (op.is(PrimId::attention)) {
        EXPECT_DOUBLE_EQ(AttentionParams::of(op).scale,
                         (v.q_scale != 0 ? v.q_scale : 1) * (v.scores_scale != 0 ? v.scores_scale : 1));
      }
    }
  }
}

// Dropout on the probabilities (composite::dropout's Philox mask) becomes the ops' keep
// probability and stream: the fused ops draw the same bits, so the values agree to rounding.
TEST(FuseAttention, DropoutOnTheProbabilitiesIsFusedWithTheSameBits) {
  const std::vector<Variant> dropped = {{.dropout = 0.25},
                                        {.causal = false, .tq = 7, .tk = 11, .dropout = 0.5},
                                        {.dropout = 0.1, .q_scale = 0.3, .scores_scale = 0.45},
                                        {.backward = false, .dropout = 0.25}};
  for (const Variant& v : dropped) {
    const Circuit f = check_equivalent(v);
    ASSERT_EQ(count_prim(f, PrimId::attention), 1u) << f.dump();
    EXPECT_EQ(count_prim(f, PrimId::attention_grad), v.backward ? 1u : 0u) << f.dump();
    EXPECT_EQ(count_prim(f, PrimId::random), 0u) << f.dump();
    EXPECT_EQ(square_values(f, v.tq, v.tk), 0u) << f.dump();
    for (const Op& op : f.ops()) {
      if (op.is(PrimId::attention)) {
        EXPECT_DOUBLE_EQ(AttentionParams::of(op).keep, 1.0 - v.dropout);
      }
    }
  }
}

// An additive mask on the (scaled) scores, of any shape that broadcasts to theirs, becomes an
// input of both ops: padding masks (B, 1, 1, Tk), biases (Tq, Tk), full ones, with the causal
// mask, scales and dropout.
TEST(FuseAttention, AdditiveMasksAreFused) {
  const std::vector<Variant> masked = {
      {.mask = Shape{2, 1, 1, 13}},
      {.mask = Shape{13, 13}},
      {.causal = false, .tq = 7, .tk = 11, .mask = Shape{2, 3, 7, 11}},
      {.causal = false, .tq = 7, .tk = 11, .mask = Shape{3, 1, 11}},
      {.dropout = 0.25, .scores_scale = 0.45, .mask = Shape{2, 1, 13, 1}},
      {.backward = false, .q_scale = 0.3, .mask = Shape{1, 13}},
  };
  for (const Variant& v : masked) {
    const Circuit f = check_equivalent(v);
    ASSERT_EQ(count_prim(f, PrimId::attention), 1u) << f.dump();
    EXPECT_EQ(count_prim(f, PrimId::attention_grad), v.backward ? 1u : 0u) << f.dump();
    EXPECT_EQ(square_values(f, v.tq, v.tk), 0u) << f.dump();
    for (const Op& op : f.ops())
      if (op.is(PrimId::attention) || op.is(PrimId::attention_grad)) {
        EXPECT_TRUE(AttentionParams::of(op).mask);
        EXPECT_EQ(f.info(op.inputs[3]).shape, v.mask);
      }
  }
}
// Only dq wanted: attention_grad computes all three gradients, and dk, dv go unread.
TEST(FuseAttention, APartialBackwardIsFused) {
  const Circuit f = check_equivalent({.wrt = {0}});
  EXPECT_EQ(count_prim(f, PrimId::attention), 1u);
  EXPECT_EQ(count_prim(f, PrimId::attention_grad), 1u);
  EXPECT_EQ(square_values(f, 13, 13), 0u) << f.dump();
}

TEST(FuseAttention, ForwardAloneFusesAlone) {
  const Circuit f = check_equivalent({.backward = false});
  EXPECT_EQ(count_prim(f, PrimId::attention), 1u);
  EXPECT_EQ(count_prim(f, PrimId::attention_grad), 0u);
  EXPECT_EQ(square_values(f, 13, 13), 0u);
}

// What the pattern does not cover stays as recorded (and still computes the same values).
TEST(FuseAttention, VariantsOutsideThePatternAreLeftAlone) {
  const std::vector<Variant> left_alone = {
      {.probabilities_out = true},  // something outside reads the probabilities
      {.probabilities_out = true, .dropout = 0.25},
      {.mask = Shape{2, 1, 1, 13}, .mask_gradient = true},  // a learned mask (bias)
  };
  for (const Variant& v : left_alone) {
    const Circuit f = check_equivalent(v);
    EXPECT_EQ(count_prim(f, PrimId::attention), 0u);
    EXPECT_EQ(count_prim(f, PrimId::attention_grad), 0u);
  }
}

// Circuits close to the pattern that the rewrite must leave alone or fuse correctly: a (1, 1)
// "causal" mask (all true, by broadcasting), q = k with a scale, a requested split output or a
// (B, T, H, d) value differentiated, a packed projection reshaped to (T, B, H, d), and the scores
// added to themselves as an "additive mask". Each must give the unfused values.
TEST(FuseAttention, NearMissesGiveTheUnfusedValues) {
  struct Case {
    const char* name;
    std::function<void(Built&, Builder&)> build;
  };
  auto input = [](Built& b, const Shape& s) {
    b.bindings.push_back(testing::random_tensor({s, DType::f64, -1.5, 1.5}, 40 + b.bindings.size()));
    return b.c.add_external({s, DType::f64}, ValueRole::Input);
  };
  auto packed = [&](Built& b, Builder& bl, bool want_split, bool want_dq_heads, bool swap_bt) {
    const int64_t batch = 2, t = 5, heads = 3, d = 4;
    ValueId x = input(b, Shape{batch, t, 3 * heads * d});
    ValueId r = input(b, swap_bt ? Shape{batch * t, heads * d} : Shape{batch, t, heads, d});
    std::vector<ValueId> parts = bl.split(x, 2, {heads * d, heads * d, heads * d}), hd;
    for (ValueId p : parts)
      hd.push_back(bl.reshape(p, swap_bt ? Shape{t, batch, heads, d} : Shape{batch, t, heads, d}));
    auto perm = [&](ValueId v) { return bl.permute(v, {0, 2, 1, 3}); };
    ValueId y = perm(bl.matmul(composite::softmax(bl, bl.matmul(perm(hd[0]), perm(hd[1]), false, true)), perm(hd[2])));
    if (swap_bt) y = bl.reshape(y, Shape{batch * t, heads * d});
    b.outputs = {y};
    if (want_split) b.outputs.push_back(parts[0]);
    std::vector<ValueId> wrt = {x};
    if (want_dq_heads) wrt.push_back(hd[0]);
    for (ValueId g : differentiate(b, bl, bl.reduce_all(ReduceKind::Sum, bl.mul(y, r)), wrt)) b.outputs.push_back(g);
  };
  const std::vector<Case> cases = {
      {"the scores themselves as the additive mask (forward only)",
       [&](Built& b, Builder& bl) {
         ValueId q = input(b, {2, 3, 5, 4}), k = input(b, {2, 3, 5, 4}), v = input(b, {2, 3, 5, 4});
         ValueId s = bl.matmul(q, k, false, true);
         b.outputs = {bl.matmul(composite::softmax(bl, bl.add(bl.scale(s, 0.5), s)), v)};
       }},
      {"(1, 1) mask",
       [&](Built& b, Builder& bl) {
         ValueId q = input(b, {2, 3, 5, 4}), k = input(b, {2, 3, 5, 4}), v = input(b, {2, 3, 5, 4}),
                 r = input(b, {2, 3, 5, 4});
         ValueId a = bl.where(composite::causal_mask(bl, 1), bl.matmul(q, k, false, true),
                              bl.fill(Shape{}, DType::f64, -std::numeric_limits<double>::infinity()));
         ValueId y = bl.matmul(composite::softmax(bl, a), v);
         b.outputs = {y};
         for (ValueId g : differentiate(b, bl, bl.reduce_all(ReduceKind::Sum, bl.mul(y, r)), {q, k, v}))
           b.outputs.push_back(g);
       }},
      {"q = k, scaled",
       [&](Built& b, Builder& bl) {
         ValueId x = input(b, {2, 3, 5, 4}), v = input(b, {2, 3, 5, 4});
         ValueId q = bl.scale(x, 0.5);
         b.outputs = {bl.matmul(composite::softmax(bl, bl.matmul(q, q, false, true)), v)};
       }},
      {"packed, split output requested", [&](Built& b, Builder& bl) { packed(b, bl, true, false, false); }},
      {"packed, (B, T, H, d) gradient requested", [&](Built& b, Builder& bl) { packed(b, bl, false, true, false); }},
      {"packed, reshaped to (T, B, H, d)", [&](Built& b, Builder& bl) { packed(b, bl, false, false, true); }},
  };
  for (const Case& k : cases) check_built_equivalent(k.build, k.name);
}

// A planted error in the fused backward (dk's sign) fails the equivalence check above: the
// check is not vacuous.
TEST(FuseAttention, APlantedWrongGradientIsCaught) {
  const Pair p = record_both([](Built& b, Builder& bl) { record({}, b, bl); });
  ASSERT_EQ(count_prim(p.fused_c, PrimId::attention_grad), 1u);
  std::vector<HostTensor> want = execute(p.plain_c, p.plain.bindings, p.plain_out);
  std::vector<HostTensor> got = execute(p.fused_c, p.fused.bindings, p.fused_out);
  ASSERT_LT(testing::relative_error(got[2], want[2]), 1e-12);
  for (int64_t i = 0; i < got[2].numel(); ++i) got[2].set(i, -got[2].get(i));
  EXPECT_GT(testing::relative_error(got[2], want[2]), 1.0);
}

// The plan of one recorded training step (forward and backward) of `model`'s loss.
template <class Model>
const Circuit& step_plan(Model& model, int64_t t) {
  Engine& engine = Engine::current();
  Tensor x = Tensor::from_host(HostTensor::zeros(DType::i32, Shape{2, t}));
  Tensor loss = model.loss(x, x);
  loss.backward();
  engine.realize();
  return engine.last_plan()->program->circuit();
}

// With and without dropout on the attention probabilities (the model's attn_dropout), and with
// the bf16 precision policy (its casts absorbed: the ops' bf16 operands).
TEST(FuseAttention, GptStepsCarryFusedAttentionInEveryLayer) {
  for (auto [dropout, precision] :
       {std::pair{0.0, Precision::f32}, std::pair{0.1, Precision::f32}, std::pair{0.1, Precision::bf16}}) {
    ScopedPrecision policy(precision);
    models::GPTConfig cfg = testing::tiny_gpt_config(2);
    cfg.dropout = dropout;
    manual_seed(5);
    models::GPT model(cfg);
    const int64_t t = 7;  // odd, shorter than the block
    {
      const Circuit& c = step_plan(model, t);
      EXPECT_EQ(count_prim(c, PrimId::attention), 2u) << "dropout " << dropout;
      EXPECT_EQ(count_prim(c, PrimId::attention_grad), 2u);
      EXPECT_EQ(square_values(c, t, t), 0u);
      // The ops read the QKV projection packed and write its gradient packed: no split, concat or
      // permute of the heads is left, and the scale is the op's.
      EXPECT_EQ(count_prim(c, PrimId::split), 0u) << c.dump();
      EXPECT_EQ(count_prim(c, PrimId::concat), 0u);
      EXPECT_EQ(count_prim(c, PrimId::permute), 0u);
      for (const Op& op : c.ops())
        if (op.is(PrimId::attention) || op.is(PrimId::attention_grad)) {
          const AttentionParams a = AttentionParams::of(op);
          EXPECT_EQ(a.packed_heads, cfg.n_head);
          EXPECT_DOUBLE_EQ(a.scale, 1.0 / std::sqrt(static_cast<double>(cfg.n_embd / cfg.n_head)));
          EXPECT_DOUBLE_EQ(a.keep, 1.0 - dropout);
          EXPECT_EQ(a.bf16, precision == Precision::bf16);
        }
    }
    testing::ScopedPipeline off("-fuse_attention");
    const Circuit& c = step_plan(model, t);
    EXPECT_EQ(count_prim(c, PrimId::attention), 0u);
    EXPECT_GT(square_values(c, t, t), 0u);
  }
}

// Attention is found before differentiation, so the way other Prims' VJPs are written does not
// matter: with every pointwise gradient re-expressed (times a filled 1: the same values, ops the
// old matcher of the sweep's output did not know), the GPT step still carries fused attention in
// both layers, forward and backward, and its values equal the unfused step's.
TEST(FuseAttention, ReExpressedSoftmaxGradientsKeepAttentionFused) {
  int rewritten = 0;
  ScopedVjpOverride* self = nullptr;
  ScopedVjpOverride guard("pointwise", [&](Builder& b, const Op& op, const std::vector<ValueId>& g) {
    std::vector<ValueId> grads = self->original()(b, op, g);
    for (ValueId& x : grads)
      if (x != kNoValue) {
        x = b.mul(x, b.fill(Shape{}, b.info(x).dtype, 1.0));
        ++rewritten;
      }
    return grads;
  });
  self = &guard;
  models::GPTConfig cfg = testing::tiny_gpt_config(2);
  cfg.dropout = 0;  // the two steps draw other streams
  manual_seed(5);
  models::GPT model(cfg);
  const int64_t t = 7;
  auto step = [&] {
    model.zero_grad();
    HostTensor tokens = HostTensor::zeros(DType::i32, Shape{2, t});
    for (int64_t i = 0; i < tokens.numel(); ++i) tokens.set(i, static_cast<double>((i * 7 + 3) % cfg.vocab_size));
    Tensor x = Tensor::from_host(tokens);
    Tensor loss = model.loss(x, x);
    loss.backward();
    Engine::current().realize();
    return std::make_pair(loss.item(), model.parameters()[0].grad().to_host());
  };
  const auto [loss, grad] = step();
  const Circuit& c = Engine::current().last_plan()->program->circuit();
  EXPECT_GT(rewritten, 0);
  EXPECT_EQ(count_prim(c, PrimId::attention), 2u) << c.dump();
  EXPECT_EQ(count_prim(c, PrimId::attention_grad), 2u);
  EXPECT_EQ(square_values(c, t, t), 0u);
  testing::ScopedPipeline off("-fuse_attention");
  const auto [plain_loss, plain_grad] = step();
  EXPECT_GT(square_values(Engine::current().last_plan()->program->circuit(), t, t), 0u);
  EXPECT_NEAR(loss, plain_loss, 1e-5 * std::abs(plain_loss));
  EXPECT_LT(testing::relative_error(grad, plain_grad), 1e-4);
}

// One bf16 cast read as both k and v (a value in two roles, the cast listed once): the chain
// becomes one attention op, after CSE in the pipeline's pass and in place before a backward.
TEST(FuseAttention, OneCastAsKeyAndValueIsFusedOnce) {
  for (bool backward : {false, true}) {
    Built b;
    Builder bl(b.c);
    const Shape s{2, 3, 5, 4};
    const ValueId q = b.c.add_external({s, DType::f32}, ValueRole::Input),
                  x = b.c.add_external({s, DType::f32}, ValueRole::Input);
    const ValueId kv = bl.cast(x, DType::bf16);
    const ValueId p = composite::softmax(bl, bl.matmul(bl.cast(q, DType::bf16), kv, false, true));
    const ValueId y = bl.matmul(bl.cast(p, DType::bf16), kv);
    b.outputs = {y};
    if (backward) {
      b.fuse = true;
      for (ValueId g : differentiate(b, bl, bl.reduce_all(ReduceKind::Sum, y), {q, x})) b.outputs.push_back(g);
    }
    std::vector<ValueId> out = b.outputs;
    const Circuit f = fuse_attention(cse(b.c, out), out);
    EXPECT_EQ(count_prim(f, PrimId::attention), 1u) << f.dump();
    EXPECT_EQ(count_prim(f, PrimId::attention_grad), backward ? 1u : 0u);
  }
}

// grad() leaves attention as recorded, so that its gradients can be differentiated again
// (attention_grad has no VJP): a gradient of a gradient through attention.
TEST(FuseAttention, GradientsOfGradientsThroughAttention) {
  const Tensor q = Tensor::from_host(testing::random_tensor({Shape{2, 5, 4}, DType::f64}, 1));
  const Tensor k = Tensor::from_host(testing::random_tensor({Shape{2, 5, 4}, DType::f64}, 2));
  const Tensor v = Tensor::from_host(testing::random_tensor({Shape{2, 5, 4}, DType::f64}, 3));
  const Tensor y = matmul(softmax(causal_mask_fill(matmul(q, k, false, true))), v);
  const Tensor dq = grad(sum(y * y), {q})[0];
  const Tensor dk = grad(sum(dq * dq), {k})[0];
  const std::vector<double> values = dk.to_vector();
  double norm = 0;
  for (double d : values) norm += d * d;
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_GT(norm, 0.0);
}

// A handle a user keeps on the probabilities when backward() runs keeps the chain as recorded
// (the handle gets its values); dropped before backward(), the chain becomes attention.
TEST(FuseAttention, AHandleOnTheProbabilitiesKeepsTheChain) {
  Engine& engine = Engine::current();
  const Tensor q = Tensor::parameter("fa_q", testing::random_tensor({Shape{2, 5, 4}, DType::f32}, 1));
  const Tensor k = Tensor::parameter("fa_k", testing::random_tensor({Shape{2, 5, 4}, DType::f32}, 2));
  const Tensor v = Tensor::parameter("fa_v", testing::random_tensor({Shape{2, 5, 4}, DType::f32}, 3));
  for (bool keep : {true, false}) {
    Tensor p = softmax(causal_mask_fill(matmul(q, k, false, true)));
    Tensor y = matmul(p, v);
    const Tensor loss = sum(y * y);
    if (!keep) p = Tensor();
    loss.backward();
    engine.realize();
    const Circuit& c = engine.last_plan()->program->circuit();
    EXPECT_EQ(count_prim(c, PrimId::attention), keep ? 0u : 1u) << c.dump();
    EXPECT_EQ(count_prim(c, PrimId::attention_grad), keep ? 0u : 1u);
    if (keep) {
      const HostTensor probabilities = p.to_host();
      EXPECT_NEAR(probabilities.get(0), 1.0, 1e-6);  // query 0 sees key 0 only
      EXPECT_EQ(probabilities.get(1), 0.0);
    }
  }
}

// In f32 and with the bf16 precision policy.
TEST(FuseAttention, LlamaStepsWithGroupedQueriesAndRotaryEmbeddingsAreFused) {
  for (Precision precision : {Precision::f32, Precision::bf16}) {
    ScopedPrecision policy(precision);
    models::LlamaConfig cfg;
    cfg.n_layer = 2;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.n_embd = 32;
    cfg.block_size = 16;
    manual_seed(5);
    models::Llama model(cfg);
    const Circuit& c = step_plan(model, 9);
    EXPECT_EQ(count_prim(c, PrimId::attention), 2u) << precision_name(precision);
    EXPECT_EQ(count_prim(c, PrimId::attention_grad), 2u);
    EXPECT_EQ(square_values(c, 9, 9), 0u);
    // The ops read k and v unrepeated: no broadcast of them is left, nor the sums of their
    // gradients over the groups.
    for (const Op& op : c.ops()) EXPECT_FALSE(op.is(PrimId::broadcast) && c.info(op.outputs[0]).shape.rank() == 5);
    for (const Op& op : c.ops())
      if (op.is(PrimId::attention) || op.is(PrimId::attention_grad)) {
        EXPECT_EQ(AttentionParams::of(op).kv_groups, 2);
        EXPECT_EQ(AttentionParams::of(op).bf16, precision == Precision::bf16);
      }
  }
}

TEST(FuseAttention, NonCausalMultiHeadAttentionIsFused) {
  nn::AttentionOptions o;
  o.dim = 16;
  o.n_heads = 2;
  o.causal = false;
  o.bias = true;
  manual_seed(3);
  nn::MultiHeadAttention layer(o);
  Engine& engine = Engine::current();
  Tensor x = Tensor::from_host(testing::random_tensor({Shape{2, 5, 16}, DType::f32}, 4));
  Tensor y = layer.forward(x);
  sum(y * y).backward();
  engine.realize();
  const Circuit& c = engine.last_plan()->program->circuit();
  EXPECT_EQ(count_prim(c, PrimId::attention), 1u) << c.dump();
  EXPECT_EQ(count_prim(c, PrimId::attention_grad), 1u);
}

}  // namespace
// MultiHeadAttention with an additive padding mask (-inf at the last two keys of sequence 1):
// the plan carries the fused ops with the mask, and values and gradients equal the unfused
// chain's (f32, 1e-5 norm-relative: the same math in another order).
TEST(FuseAttention, MultiHeadAttentionWithAPaddingMaskIsFused) {
  for (bool causal : {false, true}) {
    nn::AttentionOptions o;
    o.dim = 16;
    o.n_heads = 2;
    o.causal = causal;
    manual_seed(3);
    nn::MultiHeadAttention layer(o);
    HostTensor pad = HostTensor::zeros(DType::f32, Shape{2, 1, 1, 5});
    for (int64_t j : {3, 4}) pad.set(5 + j, -std::numeric_limits<double>::infinity());
    const Tensor x = Tensor::from_host(testing::random_tensor({Shape{2, 5, 16}, DType::f32}, 4));
    const Tensor mask = Tensor::from_host(pad);
    auto run = [&] {
      Engine& engine = Engine::current();
      layer.zero_grad();
      Tensor y = layer.forward(x, mask);
      sum(y * y).backward();
      engine.realize();
      return std::make_pair(y.to_host(), layer.q_proj->weight.grad().to_host());
    };
    const auto [y, grad] = run();
    const Circuit& c = Engine::current().last_plan()->program->circuit();
    EXPECT_EQ(count_prim(c, PrimId::attention), 1u) << c.dump();
    for (const Op& op : c.ops()) {
      if (op.is(PrimId::attention)) {
        EXPECT_TRUE(AttentionParams::of(op).mask);
      }
    }
    testing::ScopedPipeline off("-fuse_attention");
    const auto [y_plain, grad_plain] = run();
    EXPECT_LT(testing::relative_error(y, y_plain), 1e-5);
    EXPECT_LT(testing::relative_error(grad, grad_plain), 1e-5);
  }
}

TEST(FuseAttention, AMaskThatDoesNotBroadcastIsAnErrorNamingTheLayer) {
  nn::AttentionOptions o;
  o.dim = 16;
  o.n_heads = 2;
  nn::MultiHeadAttention layer(o);
  const Tensor x = Tensor::from_host(HostTensor::zeros(DType::f32, Shape{2, 5, 16}));
  try {
    layer.forward(x, Tensor::from_host(HostTensor::zeros(DType::f32, Shape{2, 1, 1, 4})));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MultiHeadAttention"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 2, 5, 5]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 1, 1, 4]"), std::string::npos) << e.what();
  }
}

// With bf16 operands (the precision policy's casts before every product) the chain fuses into ops
// that round q, k, v and do themselves: fused and unfused differ by where they round, so each is
// measured against the exact f64 result of the same f32 inputs, and the fused error must stay
// within twice the unfused one (both are bf16's, a few 1e-3 norm-relative) and above 1e-4 (the
// rounding happens).
TEST(FuseAttention, Bf16OperandsAreFusedAndKeepTheUnfusedAccuracy) {
  const std::vector<Variant> variants = {{.bf16 = true},
                                         {.causal = false, .tq = 7, .tk = 11, .scores_scale = 0.45, .bf16 = true},
                                         {.dropout = 0.25, .q_scale = 0.3, .mask = Shape{2, 1, 1, 13}, .bf16 = true}};
  for (const Variant& v : variants) {
    const Pair p = record_both([&](Built& b, Builder& bl) { record(v, b, bl); });
    const Circuit &plain = p.plain_c, &fused = p.fused_c;
    const Built& b = p.plain;
    ASSERT_EQ(count_prim(fused, PrimId::attention), 1u) << fused.dump();
    ASSERT_EQ(count_prim(fused, PrimId::attention_grad), 1u) << fused.dump();
    EXPECT_EQ(count_prim(fused, PrimId::cast), 0u) << fused.dump();
    EXPECT_EQ(square_values(fused, v.tq, v.tk), 0u) << fused.dump();
    // The exact values: the same inputs in f64, no rounding.
    Variant exact_v = v;
    exact_v.bf16 = false;
    Built exact = build(exact_v, false);
    for (size_t i = 0; i < exact.bindings.size(); ++i)
      if (b.bindings[i].dtype() == DType::f32)
        for (int64_t j = 0; j < b.bindings[i].numel(); ++j) exact.bindings[i].set(j, b.bindings[i].get(j));
    const std::vector<HostTensor> truth = execute(exact.c, exact.bindings, exact.outputs);
    const std::vector<HostTensor> unfused_values = execute(plain, b.bindings, p.plain_out);
    const std::vector<HostTensor> fused_values = execute(fused, p.fused.bindings, p.fused_out);
    for (size_t i = 0; i < truth.size(); ++i) {
      const double unfused_error = testing::relative_error(unfused_values[i], truth[i]),
                   fused_error = testing::relative_error(fused_values[i], truth[i]);
      EXPECT_GT(unfused_error, 1e-4) << "output " << i << ": bf16 must show in the unfused chain";
      EXPECT_GT(fused_error, 1e-4) << "output " << i << ": the fused ops must round too";
      EXPECT_LT(fused_error, 2 * unfused_error) << "output " << i;
      std::printf("bf16 output %zu: unfused error %.2e, fused error %.2e\n", i, unfused_error, fused_error);
    }
  }
}
}  // namespace kiln
