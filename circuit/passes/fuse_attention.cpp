// Attention fusion: the chain a model records for attention, and the backward the reverse sweep
// emits for it, become one attention op and one attention_grad op (circuit/prims/attention.cpp).
//
// Forward, as composite::softmax and composite::apply_causal_mask record it:
//   s = matmul(q, k, tb)                              q (..., T, d), k (..., Tk, d)
//   s = pointwise in0 + in1 (s, mask)                 only with an additive mask (any shape that
//                                                     broadcasts to s's; it gets no gradient)
//   a = where(iota ge(i0, i1), s, fill -inf)          only when causal
//   m = stop_gradient(reduce max (a))                 along the last axis
//   e = pointwise exp(in0 - in1) (a, m)
//   l = reduce sum (e)
//   p = pointwise in0 / in1 (e, l)
//   r = random bernoulli keep (key, offset)           only with dropout, as composite::dropout
//   pd = pointwise (in0 * in1) * c (p, r)             records it (p's shape, c = 1 / keep)
//   o = matmul(pd, v)                                 v (..., Tk, dv); pd is p without dropout
// With bf16 operands (the bf16 precision policy) each product reads casts to bf16 of its
// operands (cast(q), cast(k); cast(pd), cast(v); in the backward cast(do) and cast(ds)), all
// four forward casts or none: the ops take the f32 values and the bf16 flag.
// Backward, as the sweep emits it from those ops' VJP rules (after CSE; do = the gradient of o):
//   dpd = matmul(do, v, tb)           dv = matmul(pd, do, ta)
//   dp = pointwise in0 * (c * in1) (dpd, r)           only with dropout (else dp = dpd)
//   g1 = pointwise in0 * (1 / in1) (dp, l)
//   g2 = pointwise in0 * neg((in1 / in2) / in2) (dp, e, l); r = broadcast(reduce sum (g2))
//   da = pointwise in0 * exp(in1 - in2) (g1 + r, a, m)
//   ds = where(mask, da, fill 0)                      only when causal
//   dq = matmul(ds, k)                dk = matmul(ds, q, ta)
// Every op must match exactly (Prim, params, bodies, wiring) and every intermediate must be read
// only inside its own chain (nothing outside needs the scores or the probabilities), or the
// circuit is left as it is. A forward whose intermediates nothing else reads (no backward: an
// evaluation) fuses alone. A constant scale on the scores (s * c, and its VJP after the mask)
// becomes the op's scale. Around a match the pass then takes, each all or nothing: a constant
// scale on q (times the op's scale); grouped-query repeats of k and v with the group sums of
// their gradients (the op's kv_groups), and otherwise the heads' permutes [0, 2, 1, 3] of q, k,
// v, o and the gradients (the op works with heads inside) and then a fused projection's split
// into q, k, v with the concat of their gradients (the op reads and writes the packed value);
// see absorb_scale_and_heads.
#include <algorithm>
#include <limits>
#include <optional>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

struct Match {
  bool causal = false, heads_inside = false;
  double scale = 1.0;
  ValueId mask = kNoValue;                    // an additive mask on the scores
  double keep = 1.0;                          // < 1: dropout on the probabilities
  ValueId key = kNoValue, offset = kNoValue;  // its stream
  int64_t packed_heads = 0;                   // > 0: q, k, v (and dq, dk, dv) are one packed value
  int64_t kv_groups = 1;                      // > 1: k and v have a head for each group of that many query heads
  ValueId q = kNoValue, k = kNoValue, v = kNoValue, o = kNoValue, d_o = kNoValue;
  bool bf16 = false;                                    // the products read bf16 casts:
  ValueId qp = kNoValue, kp = kNoValue, vp = kNoValue;  // the values they read (q, k, v without)
  std::vector<int32_t> forward;                         // op indices
  std::vector<int32_t> backward;                        // op indices, empty without a backward
  int32_t o_op = -1;  // the op computing o: attention takes its place (attention_grad the
                      // first backward op's: every backward op follows do's producer)
  ValueId dq = kNoValue, dk = kNoValue, dv = kNoValue;
};

class Matcher {
 public:
  Matcher(const Circuit& c, const std::vector<ValueId>& outputs) : c_(c), readers_(value_readers(c)) {
    protected_.assign(c.num_values(), false);
    for (ValueId o : outputs) protected_[static_cast<size_t>(o)] = true;
  }

  // The attention whose output is op `at` (a matmul), if the pattern matches there.
  std::optional<Match> match(int32_t at) {
    Match mt;
    const Op& pv = op(at);
    if (!is_matmul(pv, false, false)) return std::nullopt;
    // pd, v as the product reads them (pdp, vp: their bf16 casts with bf16 operands).
    const ValueId pdp = pv.inputs[0];
    mt.vp = pv.inputs[1];
    const Op *cast_p = bf16_cast(pdp), *cast_v = bf16_cast(mt.vp);
    if ((cast_p == nullptr) != (cast_v == nullptr)) return std::nullopt;
    mt.bf16 = cast_p != nullptr;
    const ValueId pd = mt.bf16 ? cast_p->inputs[0] : pdp;
    mt.v = mt.bf16 ? cast_v->inputs[0] : mt.vp;
    mt.o = pv.outputs[0];
    const Op* dropout = dropout_of(pd, mt);
    const ValueId p = dropout ? dropout->inputs[0] : pd;
    const Op* div = producer(p, PrimId::pointwise);
    if (!div || div->params.body != se::in(0) / se::in(1)) return std::nullopt;
    const ValueId e = div->inputs[0], l = div->inputs[1];
    const Op* sum = producer(l, PrimId::reduce);
    const Op* exp = producer(e, PrimId::pointwise);
    if (!sum || !along_last(*sum, ReduceKind::Sum) || sum->inputs[0] != e || !exp ||
        exp->params.body != se::exp(se::in(0) - se::in(1)))
      return std::nullopt;
    const ValueId a = exp->inputs[0], m = exp->inputs[1];
    const Op* stop = producer(m, PrimId::stop_gradient);
    const Op* max = stop ? producer(stop->inputs[0], PrimId::reduce) : nullptr;
    if (!max || !along_last(*max, ReduceKind::Max) || max->inputs[0] != a) return std::nullopt;
    ValueId s = a;
    const Op* where = producer(a, PrimId::where);
    if (where) {
      if (!is_causal_mask(where->inputs[0], a) || !is_fill(where->inputs[2], -std::numeric_limits<double>::infinity()))
        return std::nullopt;
      mt.causal = true;
      s = where->inputs[1];
    }
    // An additive mask: s = x + mask with x the scores' shape, the mask any value broadcast to it.
    ValueId masked = kNoValue;
    if (const Op* add = producer(s, PrimId::pointwise);
        add && add->params.body == se::in(0) + se::in(1) && add->inputs.size() == 2 &&
        c_.info(add->inputs[0]) == c_.info(s) && c_.info(add->inputs[1]).dtype == c_.info(s).dtype &&
        add->inputs[0] != add->inputs[1]) {
      masked = s;
      mt.mask = add->inputs[1];
      s = add->inputs[0];
    }
    // A constant scale on the scores (s = (q kᵀ) * c) becomes the op's scale.
    const Op* scores_scale = producer(s, PrimId::pointwise);
    ValueId scaled = kNoValue;
    if (scores_scale && times_constant(*scores_scale)) {
      mt.scale = *times_constant(*scores_scale);
      scaled = s;
      s = scores_scale->inputs[0];
    }
    const Op* qk = producer(s, PrimId::matmul);
    if (!qk || !is_matmul(*qk, false, true)) return std::nullopt;
    mt.qp = qk->inputs[0];
    mt.kp = qk->inputs[1];
    const Op *cast_q = bf16_cast(mt.qp), *cast_k = bf16_cast(mt.kp);
    if ((cast_q != nullptr) != mt.bf16 || (cast_k != nullptr) != mt.bf16) return std::nullopt;
    mt.q = mt.bf16 ? cast_q->inputs[0] : mt.qp;
    mt.k = mt.bf16 ? cast_k->inputs[0] : mt.kp;
    // Shapes: q (..., T, d), k (..., Tk, d), v (..., Tk, dv), one batch, one float dtype; the
    // mask (T, T) with T the scores' last two dims.
    const ValueInfo &qi = c_.info(mt.q), &ki = c_.info(mt.k), &vi = c_.info(mt.v);
    if (qi.dtype != ki.dtype || qi.dtype != vi.dtype || (qi.dtype != DType::f32 && qi.dtype != DType::f64) ||
        qi.shape.rank() < 3 || ki.shape.rank() != qi.shape.rank() || vi.shape.rank() != qi.shape.rank())
      return std::nullopt;
    const int r = qi.shape.rank();
    for (int ax = 0; ax < r - 2; ++ax)
      if (ki.shape[ax] != qi.shape[ax] || vi.shape[ax] != qi.shape[ax]) return std::nullopt;
    if (c_.info(s).shape != c_.info(p).shape || (mt.causal && c_.info(s).shape.rank() != r)) return std::nullopt;

    std::vector<ValueId> internal = {s, a, m, stop->inputs[0], e, l, p};
    mt.forward = {producer_index(s)};
    if (dropout) {
      internal.push_back(pd);
      internal.push_back(dropout->inputs[1]);
      mt.forward.push_back(producer_index(pd));
      mt.forward.push_back(producer_index(dropout->inputs[1]));
    }
    for (ValueId x : {scaled, masked})
      if (x != kNoValue) {
        internal.push_back(x);
        mt.forward.push_back(producer_index(x));
      }
    if (mt.bf16)
      for (ValueId x : {mt.qp, mt.kp, pdp, mt.vp}) {
        internal.push_back(x);
        mt.forward.push_back(producer_index(x));
      }
    if (where) mt.forward.push_back(producer_index(a));
    for (ValueId x : {stop->inputs[0], m, e, l, p}) mt.forward.push_back(producer_index(x));
    mt.forward.push_back(at);
    mt.o_op = at;
    for (ValueId x : internal)
      if (protected_[static_cast<size_t>(x)]) return std::nullopt;

    // Forward only: nothing outside the chain reads its intermediates.
    bool read_outside = false;
    for (ValueId x : internal)
      for (int32_t r2 : readers_[static_cast<size_t>(x)]) read_outside = read_outside || !in(mt.forward, r2);
    if (!read_outside) {
      absorb_scale_and_heads(mt);
      return mask_from_outside(mt) ? std::optional<Match>(mt) : std::nullopt;
    }
    if (!match_backward(mt, a, m, e, l, pdp, dropout, where != nullptr,
                        scores_scale && scaled != kNoValue ? scores_scale : nullptr))
      return std::nullopt;
    std::vector<int32_t> chain = mt.forward;
    chain.insert(chain.end(), mt.backward.begin(), mt.backward.end());
    for (ValueId x : internal)
      for (int32_t r2 : readers_[static_cast<size_t>(x)])
        if (!in(chain, r2)) return std::nullopt;
    if (!internal_to_backward(mt)) return std::nullopt;
    // attention_grad takes the place of the first backward op and reads o and lse: they come first
    // in any circuit the sweep records (every backward op depends on do), but not in every circuit.
    if (*std::min_element(mt.backward.begin(), mt.backward.end()) < mt.o_op) return std::nullopt;
    absorb_scale_and_heads(mt);
    return mask_from_outside(mt) ? std::optional<Match>(mt) : std::nullopt;
  }

 private:
  // The additive mask (if any) is made by no op the match removes (a value of the chain itself,
  // or one it absorbs, added to the scores would have nothing to be read from).
  bool mask_from_outside(const Match& mt) const {
    if (mt.mask == kNoValue) return true;
    const int32_t p = producer_index(mt.mask);
    return p < 0 || (!in(mt.forward, p) && !in(mt.backward, p));
  }

  // The backward's intermediates are read inside it only (dq, dk and dv by anything).
  bool internal_to_backward(const Match& mt) const {
    for (int32_t b : mt.backward)
      for (ValueId x : op(b).outputs) {
        if (x == mt.dq || x == mt.dk || x == mt.dv) continue;
        if (protected_[static_cast<size_t>(x)]) return false;
        for (int32_t r : readers_[static_cast<size_t>(x)])
          if (!in(mt.backward, r)) return false;
      }
    return true;
  }

  // Widens a match where the chain around it allows, all or nothing for each step:
  //  - a constant scale on q, q = x * c (and in the backward, dx = dq * c), becomes the op's
  //    scale, so attention reads x;
  //  - q, k and v that are permute(y, [0, 2, 1, 3]) of (B, T, H, d) values y, o read only by such a
  //    permute, and (in the backward) do = permute of (B, T, H, dv) and dq, dk, dv each read only
  //    by such a permute: the op works with heads inside and reads and writes the (B, T, H, d)
  //    values, with no permute left to run.
  void absorb_scale_and_heads(Match& mt) const {
    const bool backward = !mt.backward.empty();
    if (mt.q == mt.k || mt.q == mt.v || mt.k == mt.v) return;  // one value in two roles: keep it as it is
    // The scale on q (times any scale on the scores).
    if (const Op* scale = producer(mt.q, PrimId::pointwise); scale && times_constant(*scale)) {
      const Op* back = backward ? only_reader(mt.dq) : nullptr;
      if (reads_only_chain(mt, mt.q) &&
          (!backward || (back && back->is(PrimId::pointwise) && back->params.body == scale->params.body &&
                         back->inputs.size() == 1 && !protected_[static_cast<size_t>(mt.dq)]))) {
        mt.scale *= *times_constant(*scale);
        mt.forward.push_back(producer_index(mt.q));
        mt.q = scale->inputs[0];
        if (backward) {
          mt.backward.push_back(static_cast<int32_t>(back - c_.ops().data()));
          mt.dq = back->outputs[0];
        }
      }
    }
    // Grouped queries: k and v repeated for each query head of a group. The op reads them
    // unrepeated (and sums dk, dv over the group itself); the heads stay among the batch dims.
    if (absorb_kv_repeat(mt)) return;
    // The heads' permutes.
    auto heads_permute = [&](const Op* o) {
      return o && o->is(PrimId::permute) && PermuteParams::of(*o).perm == std::vector<int64_t>{0, 2, 1, 3};
    };
    const Op *pq = producer(mt.q, PrimId::permute), *pk = producer(mt.k, PrimId::permute),
             *pv = producer(mt.v, PrimId::permute), *po = only_reader(mt.o);
    if (!heads_permute(pq) || !heads_permute(pk) || !heads_permute(pv) || !heads_permute(po) ||
        protected_[static_cast<size_t>(mt.o)] || !reads_only_chain(mt, mt.q) || !reads_only_chain(mt, mt.k) ||
        !reads_only_chain(mt, mt.v))
      return;
    const Op *pdo = nullptr, *pdq = nullptr, *pdk = nullptr, *pdv = nullptr;
    if (backward) {
      pdo = producer(mt.d_o, PrimId::permute);
      pdq = only_reader(mt.dq);
      pdk = only_reader(mt.dk);
      pdv = only_reader(mt.dv);
      for (ValueId g : {mt.dq, mt.dk, mt.dv})
        if (protected_[static_cast<size_t>(g)]) return;
      if (!heads_permute(pdo) || !heads_permute(pdq) || !heads_permute(pdk) || !heads_permute(pdv)) return;
    }
    mt.heads_inside = true;
    for (const Op* p : {pq, pk, pv, po}) mt.forward.push_back(static_cast<int32_t>(p - c_.ops().data()));
    mt.q = pq->inputs[0];
    mt.k = pk->inputs[0];
    mt.v = pv->inputs[0];
    mt.o = po->outputs[0];
    if (backward) {
      for (const Op* p : {pdq, pdk, pdv}) mt.backward.push_back(static_cast<int32_t>(p - c_.ops().data()));
      mt.d_o = pdo->inputs[0];
      mt.dq = pdq->outputs[0];
      mt.dk = pdk->outputs[0];
      mt.dv = pdv->outputs[0];
    }
    absorb_packing(mt);
  }

  // With heads inside: q, k and v that are the pieces of one split of a fused projection's
  // (B, T, 3 H d) output (each reshaped to (B, T, H, d)), and (in the backward) dq, dk and dv
  // reshaped back and concatenated in that order: the ops read and write the packed values.
  void absorb_packing(Match& mt) const {
    const bool backward = !mt.backward.empty();
    const Op *rq = producer(mt.q, PrimId::reshape), *rk = producer(mt.k, PrimId::reshape),
             *rv = producer(mt.v, PrimId::reshape);
    if (!rq || !rk || !rv) return;
    const Op* split = producer(rq->inputs[0], PrimId::split);
    if (!split || split->outputs.size() != 3 || rq->inputs[0] != split->outputs[0] ||
        rk->inputs[0] != split->outputs[1] || rv->inputs[0] != split->outputs[2])
      return;
    const Shape& packed = c_.info(split->inputs[0]).shape;
    const Shape& piece = c_.info(mt.q).shape;  // (B, T, H, d)
    const int64_t width = piece[2] * piece[3];
    const SplitParams sp = SplitParams::of(*split);
    if (packed.rank() != 3 || packed[0] != piece[0] || packed[1] != piece[1] || sp.axis != 2 ||
        sp.sizes != std::vector<int64_t>{width, width, width} || c_.info(mt.k).shape != piece ||
        c_.info(mt.v).shape != piece)
      return;
    for (const Op* r : {rq, rk, rv})
      if (only_reader(r->inputs[0]) != r || protected_[static_cast<size_t>(r->inputs[0])] ||
          !reads_only_chain(mt, r->outputs[0]))
        return;
    const Op* concat = nullptr;
    std::vector<const Op*> back;
    if (backward) {
      for (ValueId g : {mt.dq, mt.dk, mt.dv}) {
        if (protected_[static_cast<size_t>(g)]) return;
        const Op* r = only_reader(g);
        if (!r || !r->is(PrimId::reshape) || c_.info(r->outputs[0]).shape != Shape{piece[0], piece[1], width} ||
            protected_[static_cast<size_t>(r->outputs[0])])
          return;
        back.push_back(r);
      }
      concat = only_reader(back[0]->outputs[0]);
      if (!concat || !concat->is(PrimId::concat) || ConcatParams::of(*concat).axis != 2 ||
          concat->inputs != std::vector<ValueId>{back[0]->outputs[0], back[1]->outputs[0], back[2]->outputs[0]})
        return;
      for (const Op* r : back)
        if (only_reader(r->outputs[0]) != concat) return;
    }
    mt.packed_heads = piece[2];
    for (const Op* o : {split, rq, rk, rv}) mt.forward.push_back(index_of(o));
    mt.q = mt.k = mt.v = split->inputs[0];
    if (backward) {
      for (const Op* o : {back[0], back[1], back[2], concat}) mt.backward.push_back(index_of(o));
      mt.dq = mt.dk = mt.dv = concat->outputs[0];
    }
  }

  // k and v that are repeat_kv_heads(x, H) of (B, H / G, T, d) values x (reshape to
  // (B, H / G, 1, T, d), broadcast to (B, H / G, G, T, d), reshape to (B, H, T, d)), both with one
  // G > 1, and (in the backward) their gradients summed back over the group (reshape, sum along
  // axis 2, reshape): the op takes x with kv_groups G.
  bool absorb_kv_repeat(Match& mt) const {
    const bool backward = !mt.backward.empty();
    struct Repeat {
      const Op *first, *broadcast, *last;
      const Op *back_first = nullptr, *sum = nullptr, *back_last = nullptr;
    };
    const Shape& qs = c_.info(mt.q).shape;
    if (qs.rank() != 4) return false;
    int64_t groups = 0;
    auto repeat_of = [&](ValueId x, ValueId grad) -> std::optional<Repeat> {
      Repeat r{producer(x, PrimId::reshape), nullptr, nullptr};
      r.last = r.first;
      if (!r.last) return std::nullopt;
      r.broadcast = producer(r.last->inputs[0], PrimId::broadcast);
      r.first = r.broadcast ? producer(r.broadcast->inputs[0], PrimId::reshape) : nullptr;
      if (!r.first) return std::nullopt;
      const Shape &src = c_.info(r.first->inputs[0]).shape, &wide = c_.info(r.broadcast->outputs[0]).shape;
      if (src.rank() != 4 || src[0] != qs[0] || src[2] != qs[2] || src[3] != qs[3] || src[1] == 0 ||
          qs[1] % src[1] != 0 || c_.info(x).shape != qs)
        return std::nullopt;
      const int64_t g = qs[1] / src[1];
      if (g < 2 || (groups != 0 && g != groups) ||
          c_.info(r.first->outputs[0]).shape != Shape{src[0], src[1], 1, src[2], src[3]} ||
          wide != Shape{src[0], src[1], g, src[2], src[3]})
        return std::nullopt;
      for (const Op* o : {r.first, r.broadcast})
        if (only_reader(o->outputs[0]) != (o == r.first ? r.broadcast : r.last) ||
            protected_[static_cast<size_t>(o->outputs[0])])
          return std::nullopt;
      if (!reads_only_chain(mt, x)) return std::nullopt;
      if (backward) {
        if (protected_[static_cast<size_t>(grad)]) return std::nullopt;
        r.back_first = only_reader(grad);
        if (!r.back_first || !r.back_first->is(PrimId::reshape) || c_.info(r.back_first->outputs[0]).shape != wide ||
            protected_[static_cast<size_t>(r.back_first->outputs[0])])
          return std::nullopt;
        r.sum = only_reader(r.back_first->outputs[0]);
        if (!r.sum || !ReduceParams::is_sum_along(*r.sum, 2) || protected_[static_cast<size_t>(r.sum->outputs[0])])
          return std::nullopt;
        r.back_last = only_reader(r.sum->outputs[0]);
        if (!r.back_last || !r.back_last->is(PrimId::reshape) || c_.info(r.back_last->outputs[0]).shape != src)
          return std::nullopt;
      }
      groups = g;
      return r;
    };
    const std::optional<Repeat> rk = repeat_of(mt.k, mt.dk), rv = repeat_of(mt.v, mt.dv);
    if (!rk || !rv) return false;
    mt.kv_groups = groups;
    for (const Repeat* r : {&*rk, &*rv})
      for (const Op* o : {r->first, r->broadcast, r->last}) mt.forward.push_back(index_of(o));
    mt.k = rk->first->inputs[0];
    mt.v = rv->first->inputs[0];
    if (backward) {
      for (const Repeat* r : {&*rk, &*rv})
        for (const Op* o : {r->back_first, r->sum, r->back_last}) mt.backward.push_back(index_of(o));
      mt.dk = rk->back_last->outputs[0];
      mt.dv = rv->back_last->outputs[0];
    }
    return true;
  }

  int32_t index_of(const Op* o) const { return static_cast<int32_t>(o - c_.ops().data()); }
  // The op casting an f32 value to bf16 that computes x, if one does.
  const Op* bf16_cast(ValueId x) const {
    const Op* c = producer(x, PrimId::cast);
    return c && c_.info(x).dtype == DType::bf16 && c_.info(c->inputs[0]).dtype == DType::f32 ? c : nullptr;
  }
  // Every reader of v is an op of the match (and v is not a requested output).
  bool reads_only_chain(const Match& mt, ValueId v) const {
    if (protected_[static_cast<size_t>(v)]) return false;
    for (int32_t r : readers_[static_cast<size_t>(v)])
      if (!in(mt.forward, r) && !in(mt.backward, r)) return false;
    return true;
  }

  // pd = (p * r) * c with r a Bernoulli(keep) tensor of pd's shape and dtype and c = 1 / keep
  // (composite::dropout): the dropout op, with the match's keep and stream set; else null.
  const Op* dropout_of(ValueId pd, Match& mt) const {
    const Op* d = producer(pd, PrimId::pointwise);
    if (!d || d->inputs.size() != 2) return nullptr;
    const ScalarExp& body = d->params.body;
    if (body.op() != ExpOp::Mul || body.args()[0] != se::in(0) * se::in(1) || body.args()[1].op() != ExpOp::Const)
      return nullptr;
    const Op* r = producer(d->inputs[1], PrimId::random);
    if (!r) return nullptr;
    const RandomParams rp = RandomParams::of(*r);
    const ValueInfo& info = c_.info(pd);
    if (rp.kind != RandomKind::Bernoulli || rp.shape != info.shape || rp.dtype != info.dtype ||
        !(c_.info(d->inputs[0]) == info) || !(rp.probability > 0.0 && rp.probability < 1.0) ||
        body.args()[1].const_value() != 1.0 / rp.probability)
      return nullptr;
    mt.keep = rp.probability;
    mt.key = r->inputs[0];
    mt.offset = r->inputs[1];
    return d;
  }

  // `pd`: the probabilities o's product reads (after `dropout`, if any; their bf16 cast with bf16
  // operands). `scores_scale`: the forward's scale on the scores, whose VJP (the same scale)
  // follows the mask.
  bool match_backward(Match& mt, ValueId a, ValueId m, ValueId e, ValueId l, ValueId pd, const Op* dropout, bool causal,
                      const Op* scores_scale) {
    // dv = matmul(pd, do, ta): it names do (its bf16 cast with bf16 operands).
    const Op* dv = reader(pd, [&](const Op& o) { return is_matmul(o, true, false) && o.inputs[0] == pd; });
    if (!dv) return false;
    const ValueId dop = dv->inputs[1];
    const Op* cast_do = mt.bf16 ? bf16_cast(dop) : nullptr;
    if (mt.bf16 && !cast_do) return false;
    mt.d_o = mt.bf16 ? cast_do->inputs[0] : dop;
    mt.dv = dv->outputs[0];
    if (c_.info(mt.d_o) != c_.info(mt.o)) return false;
    const Op* dp = reader(
        dop, [&](const Op& o) { return is_matmul(o, false, true) && o.inputs[0] == dop && o.inputs[1] == mt.vp; });
    if (!dp) return false;
    ValueId dpv = dp->outputs[0];
    const Op* undrop = nullptr;  // dp = dpd * (c * r)
    if (dropout) {
      const ValueId dpd = dpv, r = dropout->inputs[1];
      const ScalarExp want = se::in(0) * (dropout->params.body.args()[1] * se::in(1));
      undrop = reader(dpd, [&](const Op& o) {
        return o.is(PrimId::pointwise) && o.inputs == std::vector<ValueId>{dpd, r} && o.params.body == want;
      });
      if (!undrop) return false;
      dpv = undrop->outputs[0];
    }
    const Op* g1 = reader(dpv, [&](const Op& o) { return body_is(o, "(in0 * (1 / in1))", {dpv, l}); });
    const Op* g2 = reader(dpv, [&](const Op& o) {
      return body_is(o, "(in0 * neg(((in1 / in2) / in2)))", {dpv, e, l});
    });
    if (!g1 || !g2) return false;
    const Op* rsum = only_reader(g2->outputs[0]);
    if (!rsum || !along_last(*rsum, ReduceKind::Sum)) return false;
    const Op* rb = only_reader(rsum->outputs[0]);
    if (!rb || !rb->is(PrimId::broadcast) || c_.info(rb->outputs[0]).shape != c_.info(e).shape) return false;
    const ValueId g1v = g1->outputs[0], rbv = rb->outputs[0];
    const Op* g3 = reader(g1v, [&](const Op& o) { return body_is(o, "(in0 + in1)", {g1v, rbv}); });
    if (!g3) return false;
    const ValueId g3v = g3->outputs[0];
    const Op* da = reader(g3v, [&](const Op& o) { return body_is(o, "(in0 * exp((in1 - in2)))", {g3v, a, m}); });
    if (!da) return false;
    ValueId ds = da->outputs[0];
    const Op* mask = nullptr;
    if (causal) {
      mask = reader(ds, [&](const Op& o) {
        return o.is(PrimId::where) && o.inputs[1] == ds && is_causal_mask(o.inputs[0], ds) && is_fill(o.inputs[2], 0.0);
      });
      if (!mask) return false;
      ds = mask->outputs[0];
    }
    const Op* unscale = nullptr;
    if (scores_scale) {
      unscale = reader(ds, [&](const Op& o) {
        return o.is(PrimId::pointwise) && o.inputs == std::vector<ValueId>{ds} &&
               o.params.body == scores_scale->params.body;
      });
      if (!unscale) return false;
      ds = unscale->outputs[0];
    }
    const Op* cast_ds = nullptr;
    if (mt.bf16) {
      cast_ds = reader(ds, [&](const Op& o) { return &o == bf16_cast(o.outputs[0]); });
      if (!cast_ds) return false;
      ds = cast_ds->outputs[0];
    }
    const Op* dq = reader(
        ds, [&](const Op& o) { return is_matmul(o, false, false) && o.inputs[0] == ds && o.inputs[1] == mt.kp; });
    const Op* dk =
        reader(ds, [&](const Op& o) { return is_matmul(o, true, false) && o.inputs[0] == ds && o.inputs[1] == mt.qp; });
    if (!dq || !dk) return false;
    mt.dq = dq->outputs[0];
    mt.dk = dk->outputs[0];
    for (const Op* o : {dv, dp, undrop, g1, g2, rsum, rb, g3, da, mask, unscale, dq, dk, cast_do, cast_ds})
      if (o) mt.backward.push_back(static_cast<int32_t>(o - c_.ops().data()));
    std::sort(mt.backward.begin(), mt.backward.end());
    return true;
  }

  const Op& op(int32_t i) const { return c_.ops()[static_cast<size_t>(i)]; }
  int32_t producer_index(ValueId v) const { return c_.value(v).producer; }
  const Op* producer(ValueId v, PrimId prim) const {
    const int32_t p = c_.value(v).producer;
    return p >= 0 && op(p).is(prim) ? &op(p) : nullptr;
  }
  template <class Pred>
  const Op* reader(ValueId v, Pred pred) const {
    for (int32_t r : readers_[static_cast<size_t>(v)])
      if (pred(op(r))) return &op(r);
    return nullptr;
  }
  const Op* only_reader(ValueId v) const {
    const auto& r = readers_[static_cast<size_t>(v)];
    return r.size() == 1 ? &op(r[0]) : nullptr;
  }
  // c where o is pointwise in0 * c over one input.
  static std::optional<double> times_constant(const Op& o) {
    if (!o.is(PrimId::pointwise) || o.inputs.size() != 1) return std::nullopt;
    const ScalarExp& body = o.params.body;
    if (body.op() != ExpOp::Mul || body.args()[0] != se::in(0) || body.args()[1].op() != ExpOp::Const)
      return std::nullopt;
    return body.args()[1].const_value();
  }
  static bool in(const std::vector<int32_t>& ops, int32_t o) {
    return std::find(ops.begin(), ops.end(), o) != ops.end();
  }
  static bool is_matmul(const Op& o, bool ta, bool tb) {
    if (!o.is(PrimId::matmul)) return false;
    const MatmulParams mp = MatmulParams::of(o);
    return mp.transpose_a == ta && mp.transpose_b == tb;
  }
  bool along_last(const Op& o, ReduceKind kind) const {
    if (!o.is(PrimId::reduce)) return false;
    const ReduceParams rp = ReduceParams::of(o);
    return rp.kind == kind && rp.axis == c_.info(o.inputs[0]).shape.rank() - 1;
  }
  bool body_is(const Op& o, const char* body, const std::vector<ValueId>& inputs) const {
    return o.is(PrimId::pointwise) && o.inputs == inputs && o.params.body.str() == body;
  }
  // iota ge(i0, i1) over (T, T), the last two dims of `scores` (a smaller iota would broadcast):
  // key j seen by query i when i >= j.
  bool is_causal_mask(ValueId v, ValueId scores) const {
    const Op* iota = producer(v, PrimId::iota);
    const Shape &s = c_.info(v).shape, &sc = c_.info(scores).shape;
    return iota && sc.rank() >= 2 && s == Shape{sc[sc.rank() - 2], sc[sc.rank() - 1]} && s[0] == s[1] &&
           iota->params.index == ix::ge(ix::coord(0), ix::coord(1));
  }
  bool is_fill(ValueId v, double value) const {
    const std::optional<FillParams> fill = FillParams::producing(c_, v);
    return fill && c_.info(v).shape.numel() == 1 && fill->value == value;
  }

  const Circuit& c_;
  std::vector<std::vector<int32_t>> readers_;
  std::vector<bool> protected_;
};

}  // namespace

Circuit fuse_attention(const Circuit& c, std::vector<ValueId>& outputs) {
  Matcher matcher(c, outputs);
  std::vector<Match> matches;
  for (size_t i = 0; i < c.ops().size(); ++i)
    if (auto mt = matcher.match(static_cast<int32_t>(i))) matches.push_back(std::move(*mt));
  if (matches.empty()) return c;

  // Rebuild in op order: a chain's members vanish; its attention op takes the place of the op
  // computing o, its attention_grad op the place of the backward's first op.
  std::vector<int32_t> role(c.ops().size(), -1);  // -1: copied; else the match it belongs to
  for (size_t k = 0; k < matches.size(); ++k) {
    for (int32_t f : matches[k].forward) role[static_cast<size_t>(f)] = static_cast<int32_t>(k);
    for (int32_t b : matches[k].backward) role[static_cast<size_t>(b)] = static_cast<int32_t>(k);
  }
  Circuit out;
  std::vector<ValueId> map(c.num_values(), kNoValue);
  std::vector<ValueId> lse(matches.size(), kNoValue);
  for (ValueId e : c.externals())
    map[static_cast<size_t>(e)] = out.add_external(c.info(e), c.value(e).role, c.value(e).name);
  auto mapped = [&](const std::vector<ValueId>& in) {
    std::vector<ValueId> r;
    for (ValueId v : in) r.push_back(map[static_cast<size_t>(v)]);
    return r;
  };
  auto emit = [&](const Op& like, PrimId prim, const Params& params, const std::vector<ValueId>& in, Phase phase,
                  size_t absorbed) {
    std::vector<ValueId> r = out.add_op(prim, params, mapped(in), like.scope);
    out.set_phase(out.ops().size() - 1, phase);
    out.set_absorbed(out.ops().size() - 1, static_cast<int32_t>(absorbed));
    return r;
  };
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    const int32_t k = role[i];
    if (k < 0) {
      std::vector<ValueId> r = out.add_op(*op.prim, op.params, mapped(op.inputs), op.scope);
      out.set_phase(out.ops().size() - 1, op.phase);
      out.set_absorbed(out.ops().size() - 1, op.absorbed);
      for (size_t j = 0; j < r.size(); ++j) map[static_cast<size_t>(op.outputs[j])] = r[j];
      continue;
    }
    const Match& mt = matches[static_cast<size_t>(k)];
    const Params params = AttentionParams{mt.causal,    mt.scale, mt.heads_inside,     mt.packed_heads,
                                          mt.kv_groups, mt.keep,  mt.mask != kNoValue, mt.bf16}
                              .to_params();
    // q, k, v (or the packed value), then the mask and the dropout stream
    std::vector<ValueId> qkv =
        mt.packed_heads > 0 ? std::vector<ValueId>{mt.q} : std::vector<ValueId>{mt.q, mt.k, mt.v};
    if (mt.mask != kNoValue) qkv.push_back(mt.mask);
    if (mt.keep < 1.0) {
      qkv.push_back(mt.key);
      qkv.push_back(mt.offset);
    }
    if (static_cast<int32_t>(i) == mt.o_op) {
      std::vector<ValueId> r = emit(op, PrimId::attention, params, qkv, op.phase, mt.forward.size());
      map[static_cast<size_t>(mt.o)] = r[0];
      lse[static_cast<size_t>(k)] = r[1];
    } else if (!mt.backward.empty() &&
               static_cast<int32_t>(i) == *std::min_element(mt.backward.begin(), mt.backward.end())) {
      std::vector<ValueId> in = mapped(qkv);
      in.push_back(map[static_cast<size_t>(mt.o)]);
      in.push_back(lse[static_cast<size_t>(k)]);
      in.push_back(map[static_cast<size_t>(mt.d_o)]);
      std::vector<ValueId> r = out.add_op(PrimId::attention_grad, params, in, op.scope);
      out.set_phase(out.ops().size() - 1, op.phase);
      out.set_absorbed(out.ops().size() - 1, static_cast<int32_t>(mt.backward.size()));
      map[static_cast<size_t>(mt.dq)] = r[0];
      if (mt.packed_heads == 0) {
        map[static_cast<size_t>(mt.dk)] = r[1];
        map[static_cast<size_t>(mt.dv)] = r[2];
      }
    }
  }
  for (ValueId& o : outputs) {
    o = map[static_cast<size_t>(o)];
    if (o == kNoValue) throw Error("fuse_attention: a requested output was absorbed (a bug in the pass's checks)");
  }
  out.verify();
  return dce(out, outputs);
}

}  // namespace kiln
