// The cases of attention and attention_grad (circuit/prims/attention.cpp, cuda/lower/attention.cpp).
#include <limits>

#include <kiln/circuit/prims/prim_params.hpp>

#include "prim_cases.hpp"

namespace kiln::testing {
namespace {

Params attention_params(bool causal, double scale, bool heads_inside = false) {
  return AttentionParams{causal, scale, heads_inside}.to_params();
}

// attention(q, k, v), output `out` (0: o; 2: o + lse, so that both outputs carry a gradient).
// With heads inside, lse (B, H, T, 1) is added to o (B, T, H, dv) seen as (B, H, T, dv).
BuildFn attention_of(bool causal, double scale, int out, bool heads_inside = false) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r =
        b.circuit().add_op(PrimId::attention, attention_params(causal, scale, heads_inside), {x[0], x[1], x[2]});
    if (out != 2) return r[static_cast<size_t>(out)];
    return b.add(heads_inside ? b.permute(r[0], {0, 2, 1, 3}) : r[0], r[1]);
  };
}

// attention_grad over arbitrary (q, k, v, o, lse, do[, dlse]): dq, dk and dv side by side (the
// cases give q, k and v one head size and as many keys as queries).
BuildFn attention_grad_of(bool causal, double scale, bool heads_inside = false) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> g =
        b.circuit().add_op(PrimId::attention_grad, attention_params(causal, scale, heads_inside), x);
    return b.concat(g, -1);
  };
}

// Packed: one (B, T, 3 H d) input holding q, k, v side by side (heads inside).
Params packed_params(bool causal, double scale, int64_t heads) {
  return AttentionParams{causal, scale, true, heads}.to_params();
}
BuildFn packed_attention_of(bool causal, double scale, int64_t heads) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, packed_params(causal, scale, heads), {x[0]});
    return b.add(b.permute(r[0], {0, 2, 1, 3}), r[1]);
  };
}
BuildFn packed_attention_grad_of(bool causal, double scale, int64_t heads) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    return b.circuit().add_op(PrimId::attention_grad, packed_params(causal, scale, heads), x)[0];
  };
}

// Grouped-query attention, q (B, H, T, d), k and v (B, H / groups, T, d): o + lse, and dq, dk, dv
// each flattened and side by side.
Params grouped_params(bool causal, double scale, int64_t groups) {
  return AttentionParams{causal, scale, false, 0, groups}.to_params();
}
BuildFn grouped_attention_of(bool causal, double scale, int64_t groups) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r =
        b.circuit().add_op(PrimId::attention, grouped_params(causal, scale, groups), {x[0], x[1], x[2]});
    return b.add(r[0], r[1]);
  };
}
BuildFn grouped_attention_grad_of(bool causal, double scale, int64_t groups) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> g = b.circuit().add_op(PrimId::attention_grad, grouped_params(causal, scale, groups), x);
    for (ValueId& v : g) v = b.reshape(v, Shape{b.info(v).shape.numel()});
    return b.concat(g, 0);
  };
}

// Dropout on the probabilities (keep < 1): the stream's key and offset are constants of the
// circuit (fills), so the cases' inputs stay q, k, v (and o, lse, do, dlse).
Params dropout_params(bool causal, double scale, double keep, bool heads_inside = false, int64_t packed_heads = 0) {
  return AttentionParams{causal, scale, heads_inside, packed_heads, 1, keep}.to_params();
}
std::vector<ValueId> with_stream(Builder& b, std::vector<ValueId> x, size_t at) {
  const ValueId key = b.fill(Shape{2}, DType::i32, 20261126), offset = b.fill(Shape{}, DType::i32, 3);
  x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), {key, offset});
  return x;
}
BuildFn dropout_attention_of(bool causal, double scale, double keep, bool heads_inside = false) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, dropout_params(causal, scale, keep, heads_inside),
                                                with_stream(b, {x[0], x[1], x[2]}, 3));
    return b.add(heads_inside ? b.permute(r[0], {0, 2, 1, 3}) : r[0], r[1]);
  };
}
BuildFn dropout_attention_grad_of(bool causal, double scale, double keep) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    return b.concat(
        b.circuit().add_op(PrimId::attention_grad, dropout_params(causal, scale, keep), with_stream(b, x, 3)), -1);
  };
}
BuildFn packed_dropout_attention_grad_of(bool causal, double scale, double keep, int64_t heads) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    return b.circuit().add_op(PrimId::attention_grad, dropout_params(causal, scale, keep, true, heads),
                              with_stream(b, x, 1))[0];
  };
}

// An additive mask: input 3 (after q, k, v) of the ops, any shape broadcast to the scores'.
// masked_attention_of: o + lse of attention(q, k, v, mask) for inputs (q, k, v, mask) (with heads
// inside lse is added to o seen as (B, H, T, dv)); masked_attention_grad_of: attention_grad(q, k,
// v, mask, o, lse, do) for inputs (q, k, v, mask, o, lse, do), dq, dk, dv flattened side by side.
Params mask_params(bool causal, double scale, bool heads_inside = false, int64_t packed_heads = 0, int64_t groups = 1) {
  return AttentionParams{causal, scale, heads_inside, packed_heads, groups, 1.0, true}.to_params();
}
BuildFn masked_attention_of(bool causal, double scale, bool heads_inside = false) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, mask_params(causal, scale, heads_inside), x);
    return b.add(heads_inside ? b.permute(r[0], {0, 2, 1, 3}) : r[0], r[1]);
  };
}
BuildFn masked_attention_grad_of(bool causal, double scale, int64_t groups = 1) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> g =
        b.circuit().add_op(PrimId::attention_grad, mask_params(causal, scale, false, 0, groups), x);
    for (ValueId& v : g) v = b.reshape(v, Shape{b.info(v).shape.numel()});
    return b.concat(g, 0);
  };
}
// A fixed mask made inside the circuit (so that gradient checks see no input without a gradient):
// -0.4 ((7 i0 + 3 i_last + i_{last-1}) mod 5) over `shape`.
ValueId fixed_mask(Builder& b, const Shape& shape, DType dtype) {
  const int r = shape.rank();
  IndexExp at = ix::add(ix::mul(ix::coord(0), ix::c(7)), ix::mul(ix::coord(r - 1), ix::c(3)));
  if (r > 1) at = ix::add(at, ix::coord(r - 2));
  return b.scale(b.cast(b.iota(shape, DType::i32, ix::mod(at, ix::c(5))), dtype), -0.4);
}
BuildFn fixed_mask_attention_of(bool causal, double scale, Shape mask) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    return masked_attention_of(causal, scale)(b, {x[0], x[1], x[2], fixed_mask(b, mask, b.info(x[0]).dtype)});
  };
}
// Keys [0, 40) hidden (-inf) from every query: left padding longer than a key tile.
BuildFn left_padded_attention_of(int64_t tk) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    const DType dt = b.info(x[0]).dtype;
    ValueId pad = b.where(b.iota(Shape{1, tk}, DType::i32, ix::lt(ix::coord(1), ix::c(40))),
                          b.fill(Shape{}, dt, -std::numeric_limits<double>::infinity()), b.fill(Shape{}, dt, 0.0));
    return masked_attention_of(false, 0.3)(b, {x[0], x[1], x[2], pad});
  };
}

// bf16 operands (q, k, v and do read rounded to bf16), f32 tensors.
Params bf16_params(bool causal, double scale, bool heads_inside = false) {
  return AttentionParams{causal, scale, heads_inside, 0, 1, 1.0, false, true}.to_params();
}
BuildFn bf16_attention_of(bool causal, double scale, bool heads_inside = false) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, bf16_params(causal, scale, heads_inside), x);
    return b.add(heads_inside ? b.permute(r[0], {0, 2, 1, 3}) : r[0], r[1]);
  };
}
BuildFn bf16_attention_grad_of(bool causal, double scale) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    return b.concat(b.circuit().add_op(PrimId::attention_grad, bf16_params(causal, scale), x), -1);
  };
}

// bf16 operands with q, k, v packed (B, T, 3 H d) or with grouped queries.
Params bf16_layout_params(bool causal, double scale, int64_t packed_heads, int64_t groups) {
  return AttentionParams{causal, scale, packed_heads > 0, packed_heads, groups, 1.0, false, true}.to_params();
}
BuildFn bf16_packed_attention_of(bool causal, double scale, int64_t heads) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, bf16_layout_params(causal, scale, heads, 1), {x[0]});
    return b.add(b.permute(r[0], {0, 2, 1, 3}), r[1]);
  };
}
BuildFn bf16_packed_attention_grad_of(bool causal, double scale, int64_t heads) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    return b.circuit().add_op(PrimId::attention_grad, bf16_layout_params(causal, scale, heads, 1), x)[0];
  };
}
// The same ops writing bf16 copies of their main outputs (AttentionParams::bf16_copies): the f32
// outputs compared here (tests/test_absorb_casts.cpp checks the copies bit for bit); the
// kernels with the copies' stores pass ptxas with every case.
BuildFn with_bf16_copies(PrimId prim, bool bf16, int64_t packed_heads, bool causal, double scale) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    const Params p =
        AttentionParams{causal, scale, packed_heads > 0, packed_heads, 1, 1.0, false, bf16, true}.to_params();
    std::vector<ValueId> r = b.circuit().add_op(prim, p, x);
    if (prim == PrimId::attention_grad) {
      r.resize(r.size() / 2);
      for (ValueId& v : r) v = b.reshape(v, Shape{b.info(v).shape.numel()});
      return b.concat(r, 0);
    }
    return b.add(packed_heads > 0 ? b.permute(r[0], {0, 2, 1, 3}) : r[0], r[1]);
  };
}
BuildFn bf16_grouped_attention_of(bool causal, double scale, int64_t groups) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, bf16_layout_params(causal, scale, 0, groups), x);
    return b.add(r[0], r[1]);
  };
}
BuildFn bf16_grouped_attention_grad_of(bool causal, double scale, int64_t groups) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> g =
        b.circuit().add_op(PrimId::attention_grad, bf16_layout_params(causal, scale, 0, groups), x);
    for (ValueId& v : g) v = b.reshape(v, Shape{b.info(v).shape.numel()});
    return b.concat(g, 0);
  };
}

// bf16 operands with an additive mask: inputs (q, k, v, mask) for the forward (o + lse), (q, k,
// v, mask, o, lse, do) for the backward (dq, dk, dv flattened side by side).
Params bf16_mask_params(bool causal, double scale, int64_t groups) {
  return AttentionParams{causal, scale, false, 0, groups, 1.0, true, true}.to_params();
}
BuildFn bf16_masked_attention_of(bool causal, double scale, int64_t groups = 1) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, bf16_mask_params(causal, scale, groups), x);
    return b.add(r[0], r[1]);
  };
}
BuildFn bf16_masked_attention_grad_of(bool causal, double scale, int64_t groups = 1) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> g = b.circuit().add_op(PrimId::attention_grad, bf16_mask_params(causal, scale, groups), x);
    for (ValueId& v : g) v = b.reshape(v, Shape{b.info(v).shape.numel()});
    return b.concat(g, 0);
  };
}
// Keys [0, 70) of 100 hidden from every query: the whole first key tile of 64 of the tensor-core
// kernels, so the online softmax's running max is -inf after it.
BuildFn bf16_left_padded_attention_of() {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    const DType dt = b.info(x[0]).dtype;
    ValueId pad = b.where(b.iota(Shape{1, 100}, DType::i32, ix::lt(ix::coord(1), ix::c(70))),
                          b.fill(Shape{}, dt, -std::numeric_limits<double>::infinity()), b.fill(Shape{}, dt, 0.0));
    return bf16_masked_attention_of(false, 0.3)(b, {x[0], x[1], x[2], pad});
  };
}

// bf16 operands with dropout (the stream's key and offset constants of the circuit, as above).
Params bf16_dropout_params(bool causal, double scale, double keep) {
  return AttentionParams{causal, scale, false, 0, 1, keep, false, true}.to_params();
}
BuildFn bf16_dropout_attention_of(bool causal, double scale, double keep) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> r = b.circuit().add_op(PrimId::attention, bf16_dropout_params(causal, scale, keep),
                                                with_stream(b, {x[0], x[1], x[2]}, 3));
    return b.add(r[0], r[1]);
  };
}
BuildFn bf16_dropout_attention_grad_of(bool causal, double scale, double keep) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    std::vector<ValueId> g =
        b.circuit().add_op(PrimId::attention_grad, bf16_dropout_params(causal, scale, keep), with_stream(b, x, 3));
    for (ValueId& v : g) v = b.reshape(v, Shape{b.info(v).shape.numel()});
    return b.concat(g, 0);
  };
}

}  // namespace

void attention_cases(FamilyCases& c) {
  // Gradients (f64 central differences), through the VJP rule that emits attention_grad.
  add_gradient(c, "attention_causal", {"attention"}, {F({2, 2, 5, 3}), F({2, 2, 5, 3}), F({2, 2, 5, 4})},
               attention_of(true, 0.7, 0));
  add_gradient(c, "attention_cross_with_lse", {"attention"}, {F({3, 4, 3}), F({3, 6, 3}), F({3, 6, 2})},
               attention_of(false, 1.3, 2));
  add_gradient(c, "attention_lse_only", {"attention"}, {F({2, 4, 3}), F({2, 4, 3}), F({2, 4, 2})},
               attention_of(true, 1.0, 1));
  add_gradient(c, "attention_heads_inside", {"attention"}, {F({2, 5, 3, 3}), F({2, 5, 3, 3}), F({2, 5, 3, 4})},
               attention_of(true, 0.6, 2, true));
  add_gradient(c, "attention_grouped_queries", {"attention"}, {F({2, 4, 5, 3}), F({2, 2, 5, 3}), F({2, 2, 5, 2})},
               grouped_attention_of(true, 0.8, 2));
  add_gradient(c, "attention_packed", {"attention"}, {F({2, 5, 18})}, packed_attention_of(true, 0.6, 3));
  add_gradient(c, "attention_masked_padding", {"attention"}, {F({2, 2, 6, 3}), F({2, 2, 6, 3}), F({2, 2, 6, 4})},
               fixed_mask_attention_of(true, 0.7, Shape{2, 1, 1, 6}));
  add_gradient(c, "attention_masked_bias", {"attention"}, {F({2, 4, 3}), F({2, 5, 3}), F({2, 5, 2})},
               fixed_mask_attention_of(false, 1.2, Shape{4, 5}));
  add_gradient(c, "attention_dropout", {"attention"}, {F({2, 2, 6, 3}), F({2, 2, 6, 3}), F({2, 2, 6, 4})},
               dropout_attention_of(true, 0.7, 0.6));
  add_gradient(c, "attention_dropout_cross", {"attention"}, {F({3, 4, 3}), F({3, 7, 3}), F({3, 7, 2})},
               dropout_attention_of(false, 1.1, 0.75));
  // Lowerings (f32 kernels against the Eigen reference): head sizes off 32 (a partial register
  // column), one and two registers a lane, Tq != Tk without the mask. Tolerance 1e-5
  // norm-relative: dot products of <= 72 terms and sums over <= 37 keys in another order, exp
  // within 3 ulp.
  c.lowering.push_back({"attention_causal",
                        {f32({2, 3, 70, 40}), f32({2, 3, 70, 40}), f32({2, 3, 70, 24})},
                        attention_of(true, 0.35, 2),
                        1e-5});
  // Head size 38 (not a multiple of 4) and 72 (over 64): the warp-per-row kernel; 40: the tiled one.
  c.lowering.push_back({"attention_causal_warp_rows",
                        {f32({2, 37, 38}), f32({2, 37, 38}), f32({2, 37, 38})},
                        attention_of(true, 0.35, 2),
                        1e-5});
  c.lowering.push_back(
      {"attention_cross", {f32({3, 21, 72}), f32({3, 37, 72}), f32({3, 37, 72})}, attention_of(false, 0.2, 2), 1e-5});
  c.lowering.push_back({"attention_grad_causal",
                        {f32({2, 3, 29, 40}), f32({2, 3, 29, 40}), f32({2, 3, 29, 40}), f32({2, 3, 29, 40}),
                         f32({2, 3, 29, 1}, 0, 3), f32({2, 3, 29, 40})},
                        attention_grad_of(true, 0.35),
                        1e-5});
  c.lowering.push_back({"attention_grad_with_dlse",
                        {f32({3, 19, 72}), f32({3, 19, 72}), f32({3, 19, 72}), f32({3, 19, 72}), f32({3, 19, 1}, 2, 5),
                         f32({3, 19, 72}), f32({3, 19, 1})},
                        attention_grad_of(false, 0.2),
                        1e-5});
  c.lowering.push_back({"attention_grad_tiled_with_dlse",
                        {f32({3, 19, 40}), f32({3, 19, 40}), f32({3, 19, 40}), f32({3, 19, 40}), f32({3, 19, 1}, 2, 5),
                         f32({3, 19, 40}), f32({3, 19, 1})},
                        attention_grad_of(false, 0.2),
                        1e-5});
  c.lowering.push_back({"attention_packed", {f32({2, 29, 360})}, packed_attention_of(true, 0.35, 3), 1e-5});
  c.lowering.push_back(
      {"attention_packed_warp_rows", {f32({2, 21, 3 * 2 * 72})}, packed_attention_of(true, 0.2, 2), 1e-5});
  c.lowering.push_back({"attention_grad_packed",
                        {f32({2, 23, 360}), f32({2, 23, 3, 40}), f32({2, 3, 23, 1}, 0, 3), f32({2, 23, 3, 40})},
                        packed_attention_grad_of(true, 0.35, 3),
                        1e-5});
  // Grouped queries (two query heads a key/value head): tiled (head size 40) and warp rows (38).
  c.lowering.push_back({"attention_grouped",
                        {f32({2, 4, 29, 40}), f32({2, 2, 29, 40}), f32({2, 2, 29, 40})},
                        grouped_attention_of(true, 0.35, 2),
                        1e-5});
  c.lowering.push_back({"attention_grouped_warp_rows",
                        {f32({1, 6, 21, 38}), f32({1, 2, 21, 38}), f32({1, 2, 21, 38})},
                        grouped_attention_of(false, 0.35, 3),
                        1e-5});
  for (int64_t d : {40, 38})
    c.lowering.push_back({d == 40 ? "attention_grad_grouped" : "attention_grad_grouped_warp_rows",
                          {f32({2, 4, 23, d}), f32({2, 2, 23, d}), f32({2, 2, 23, d}), f32({2, 4, 23, d}),
                           f32({2, 4, 23, 1}, 0, 3), f32({2, 4, 23, d})},
                          grouped_attention_grad_of(true, 0.35, 2),
                          1e-5});
  c.lowering.push_back({"attention_heads_inside",
                        {f32({2, 29, 3, 40}), f32({2, 29, 3, 40}), f32({2, 29, 3, 40})},
                        attention_of(true, 0.35, 2, true),
                        1e-5});
  // Dropout: the tiled forward with Tk a multiple of 4 (a Philox block per four keys) and not,
  // the warp-per-row forward, and both backward families; the factors are the reference's bits,
  // so the tolerance is the one without dropout.
  c.lowering.push_back({"attention_dropout_tiled_aligned",
                        {f32({2, 3, 68, 40}), f32({2, 3, 68, 40}), f32({2, 3, 68, 24})},
                        dropout_attention_of(true, 0.35, 0.8),
                        1e-5});
  c.lowering.push_back({"attention_dropout_tiled",
                        {f32({2, 29, 3, 40}), f32({2, 29, 3, 40}), f32({2, 29, 3, 40})},
                        dropout_attention_of(true, 0.35, 0.7, true),
                        1e-5});
  c.lowering.push_back({"attention_dropout_warp_rows",
                        {f32({3, 21, 72}), f32({3, 37, 72}), f32({3, 37, 72})},
                        dropout_attention_of(false, 0.2, 0.6),
                        1e-5});
  for (int64_t d : {40, 38})
    c.lowering.push_back({d == 40 ? "attention_grad_dropout_tiled" : "attention_grad_dropout_warp_rows",
                          {f32({2, 3, 29, d}), f32({2, 3, 29, d}), f32({2, 3, 29, d}), f32({2, 3, 29, d}),
                           f32({2, 3, 29, 1}, 0, 3), f32({2, 3, 29, d})},
                          dropout_attention_grad_of(true, 0.35, 0.7),
                          1e-5});
  c.lowering.push_back({"attention_grad_dropout_packed",
                        {f32({2, 23, 360}), f32({2, 23, 3, 40}), f32({2, 3, 23, 1}, 0, 3), f32({2, 23, 3, 40})},
                        packed_dropout_attention_grad_of(true, 0.35, 0.9, 3),
                        1e-5});
  // Additive masks: padding (B, 1, 1, Tk), biases (Tq, Tk), full and grouped ones, in both
  // kernel families; and a mask hiding a whole first key tile (the online softmax's -inf max).
  c.lowering.push_back({"attention_masked_tiled",
                        {f32({2, 29, 3, 40}), f32({2, 29, 3, 40}), f32({2, 29, 3, 40}), f32({2, 1, 1, 29})},
                        masked_attention_of(true, 0.35, true),
                        1e-5});
  c.lowering.push_back({"attention_masked_warp_rows",
                        {f32({3, 21, 72}), f32({3, 37, 72}), f32({3, 37, 72}), f32({21, 37})},
                        masked_attention_of(false, 0.2),
                        1e-5});
  for (int64_t d : {40, 38})
    c.lowering.push_back({d == 40 ? "attention_left_padded_tiled" : "attention_left_padded_warp_rows",
                          {f32({2, 3, 70, d}), f32({2, 3, 70, d}), f32({2, 3, 70, d})},
                          left_padded_attention_of(70),
                          1e-5});
  for (int64_t d : {40, 38})
    c.lowering.push_back({d == 40 ? "attention_grad_masked_tiled" : "attention_grad_masked_warp_rows",
                          {f32({2, 3, 29, d}), f32({2, 3, 29, d}), f32({2, 3, 29, d}), f32({2, 3, 29, 29}),
                           f32({2, 3, 29, d}), f32({2, 3, 29, 1}, 0, 3), f32({2, 3, 29, d})},
                          masked_attention_grad_of(true, 0.35),
                          1e-5});
  c.lowering.push_back({"attention_grad_masked_grouped",
                        {f32({2, 4, 23, 40}), f32({2, 2, 23, 40}), f32({2, 2, 23, 40}), f32({1, 4, 1, 23}),
                         f32({2, 4, 23, 40}), f32({2, 4, 23, 1}, 0, 3), f32({2, 4, 23, 40})},
                        masked_attention_grad_of(false, 0.35, 2),
                        1e-5});
  // bf16 operands: the kernels round q, k, v and do where they load them, as the reference does, so
  // the tolerance is f32's (kernels that skipped the rounding were off by 6e-4 to 7e-3).
  c.lowering.push_back({"attention_bf16_tiled",
                        {f32({2, 29, 3, 40}), f32({2, 29, 3, 40}), f32({2, 29, 3, 40})},
                        bf16_attention_of(true, 0.35, true),
                        1e-5});
  c.lowering.push_back({"attention_bf16_warp_rows",
                        {f32({3, 21, 72}), f32({3, 37, 72}), f32({3, 37, 72})},
                        bf16_attention_of(false, 0.2),
                        1e-5});
  for (int64_t d : {40, 38})
    c.lowering.push_back({d == 40 ? "attention_grad_bf16_tiled" : "attention_grad_bf16_warp_rows",
                          {f32({2, 3, 29, d}), f32({2, 3, 29, d}), f32({2, 3, 29, d}), f32({2, 3, 29, d}),
                           f32({2, 3, 29, 1}, 0, 3), f32({2, 3, 29, d})},
                          bf16_attention_grad_of(true, 0.35),
                          1e-5});
  // bf16 operands with head sizes of 16 to 64 in multiples of 16: the tensor-core kernels
  // (attention_mma.cpp). P and dS enter their products as bf16 hi + lo halves (about 16 bits
  // kept), so the tolerance stays f32's: 1e-5 norm-relative. Odd T (a partial last tile of 64 and
  // a second tile), Tq != Tk, heads inside, packed q/k/v, grouped queries, a dlse input.
  c.lowering.push_back({"attention_bf16_mma_causal",
                        {f32({2, 3, 70, 64}), f32({2, 3, 70, 64}), f32({2, 3, 70, 64})},
                        bf16_attention_of(true, 0.125),
                        1e-5});
  c.lowering.push_back({"attention_bf16_mma_cross",
                        {f32({3, 21, 32}), f32({3, 77, 32}), f32({3, 77, 16})},
                        bf16_attention_of(false, 0.3),
                        1e-5});
  c.lowering.push_back({"attention_bf16_mma_heads_inside",
                        {f32({2, 29, 3, 48}), f32({2, 29, 3, 48}), f32({2, 29, 3, 48})},
                        bf16_attention_of(true, 0.35, true),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_causal",
                        {f32({2, 3, 70, 64}), f32({2, 3, 70, 64}), f32({2, 3, 70, 64}), f32({2, 3, 70, 64}),
                         f32({2, 3, 70, 1}, 0, 3), f32({2, 3, 70, 64})},
                        bf16_attention_grad_of(true, 0.125),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_cross_with_dlse",
                        {f32({3, 21, 32}), f32({3, 77, 32}), f32({3, 77, 16}), f32({3, 21, 16}), f32({3, 21, 1}, 2, 5),
                         f32({3, 21, 16}), f32({3, 21, 1})},
                        bf16_grouped_attention_grad_of(false, 0.3, 1),
                        1e-5});
  c.lowering.push_back(
      {"attention_bf16_mma_packed", {f32({2, 67, 3 * 2 * 32})}, bf16_packed_attention_of(true, 0.2, 2), 1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_packed",
                        {f32({2, 67, 3 * 2 * 32}), f32({2, 67, 2, 32}), f32({2, 2, 67, 1}, 0, 3), f32({2, 67, 2, 32})},
                        bf16_packed_attention_grad_of(true, 0.2, 2),
                        1e-5});
  c.lowering.push_back({"attention_bf16_mma_packed_copies",
                        {f32({2, 67, 3 * 2 * 32})},
                        with_bf16_copies(PrimId::attention, true, 2, true, 0.2),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_packed_copies",
                        {f32({2, 67, 3 * 2 * 32}), f32({2, 67, 2, 32}), f32({2, 2, 67, 1}, 0, 3), f32({2, 67, 2, 32})},
                        with_bf16_copies(PrimId::attention_grad, true, 2, true, 0.2),
                        1e-5});
  c.lowering.push_back({"attention_tiled_copies",
                        {f32({3, 37, 8}), f32({3, 45, 8}), f32({3, 45, 8})},
                        with_bf16_copies(PrimId::attention, false, 0, false, 0.4),
                        1e-5});
  c.lowering.push_back(
      {"attention_grad_tiled_copies",
       {f32({3, 37, 8}), f32({3, 45, 8}), f32({3, 45, 8}), f32({3, 37, 8}), f32({3, 37, 1}, 0, 3), f32({3, 37, 8})},
       with_bf16_copies(PrimId::attention_grad, false, 0, false, 0.4),
       1e-5});
  c.lowering.push_back(
      {"attention_grad_warp_rows_copies",
       {f32({3, 37, 6}), f32({3, 37, 6}), f32({3, 37, 6}), f32({3, 37, 6}), f32({3, 37, 1}, 0, 3), f32({3, 37, 6})},
       with_bf16_copies(PrimId::attention_grad, false, 0, true, 0.4),
       1e-5});
  c.lowering.push_back({"attention_bf16_mma_grouped",
                        {f32({2, 4, 45, 32}), f32({2, 2, 45, 32}), f32({2, 2, 45, 32})},
                        bf16_grouped_attention_of(true, 0.35, 2),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_grouped",
                        {f32({2, 4, 45, 32}), f32({2, 2, 45, 32}), f32({2, 2, 45, 32}), f32({2, 4, 45, 32}),
                         f32({2, 4, 45, 1}, 0, 3), f32({2, 4, 45, 32})},
                        bf16_grouped_attention_grad_of(true, 0.35, 2),
                        1e-5});
  // The tensor-core kernels with additive masks: padding (B, 1, 1, T) and a (T, T) bias over two
  // tiles, grouped queries with a (1, H, 1, T) mask, and left padding hiding a whole key tile.
  c.lowering.push_back({"attention_bf16_mma_masked",
                        {f32({2, 2, 70, 32}), f32({2, 2, 70, 32}), f32({2, 2, 70, 32}), f32({2, 1, 1, 70})},
                        bf16_masked_attention_of(true, 0.35),
                        1e-5});
  c.lowering.push_back({"attention_bf16_mma_left_padded",
                        {f32({2, 2, 100, 32}), f32({2, 2, 100, 32}), f32({2, 2, 100, 32})},
                        bf16_left_padded_attention_of(),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_masked",
                        {f32({2, 2, 70, 32}), f32({2, 2, 70, 32}), f32({2, 2, 70, 32}), f32({70, 70}),
                         f32({2, 2, 70, 32}), f32({2, 2, 70, 1}, 0, 3), f32({2, 2, 70, 32})},
                        bf16_masked_attention_grad_of(true, 0.35),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_masked_grouped",
                        {f32({2, 4, 45, 32}), f32({2, 2, 45, 32}), f32({2, 2, 45, 32}), f32({1, 4, 1, 45}),
                         f32({2, 4, 45, 32}), f32({2, 4, 45, 1}, 0, 3), f32({2, 4, 45, 32})},
                        bf16_masked_attention_grad_of(false, 0.35, 2),
                        1e-5});
  // The tensor-core kernels with dropout: T a multiple of 4 (a Philox call for a lane's pair of
  // keys) and not (a call an element), forward and backward.
  for (int64_t t : {68, 70}) {
    const std::string tag = t == 68 ? "_aligned" : "";
    c.lowering.push_back({"attention_bf16_mma_dropout" + tag,
                          {f32({2, 2, t, 32}), f32({2, 2, t, 32}), f32({2, 2, t, 32})},
                          bf16_dropout_attention_of(true, 0.35, 0.8),
                          1e-5});
    c.lowering.push_back({"attention_grad_bf16_mma_dropout" + tag,
                          {f32({2, 2, t, 32}), f32({2, 2, t, 32}), f32({2, 2, t, 32}), f32({2, 2, t, 32}),
                           f32({2, 2, t, 1}, 0, 3), f32({2, 2, t, 32})},
                          bf16_dropout_attention_grad_of(true, 0.35, 0.7),
                          1e-5});
  }
  // Head sizes over 64 (tiles of 32, and 32 own rows in the backward): 128 and 80 with 96.
  c.lowering.push_back({"attention_bf16_mma_head_128",
                        {f32({1, 2, 70, 128}), f32({1, 2, 70, 128}), f32({1, 2, 70, 128})},
                        bf16_attention_of(true, 0.09),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_head_128",
                        {f32({1, 2, 70, 128}), f32({1, 2, 70, 128}), f32({1, 2, 70, 128}), f32({1, 2, 70, 128}),
                         f32({1, 2, 70, 1}, 0, 3), f32({1, 2, 70, 128})},
                        bf16_attention_grad_of(true, 0.09),
                        1e-5});
  c.lowering.push_back({"attention_grad_bf16_mma_head_80_96_with_dlse",
                        {f32({2, 21, 80}), f32({2, 45, 80}), f32({2, 45, 96}), f32({2, 21, 96}), f32({2, 21, 1}, 2, 5),
                         f32({2, 21, 96}), f32({2, 21, 1})},
                        bf16_grouped_attention_grad_of(false, 0.1, 1),
                        1e-5});
  c.lowering.push_back({"attention_grad_heads_inside",
                        {f32({2, 23, 3, 40}), f32({2, 23, 3, 40}), f32({2, 23, 3, 40}), f32({2, 23, 3, 40}),
                         f32({2, 3, 23, 1}, 0, 3), f32({2, 23, 3, 40})},
                        attention_grad_of(true, 0.35, true),
                        1e-5});
}

}  // namespace kiln::testing
