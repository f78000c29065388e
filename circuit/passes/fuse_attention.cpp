// Attention as a Prim before differentiation: the chain a model records for attention becomes
// one attention op (circuit/prims/attention.cpp) in the forward Circuit, before the reverse sweep
// runs, so that the sweep records attention's own VJP (one attention_grad op). No pass looks at
// what other Prims' VJPs emit: rewriting softmax's rule cannot turn attention fusion off.
//
// The chain, as composite::softmax and composite::apply_causal_mask record it:
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
// operands (cast(q), cast(k); cast(pd), cast(v)), all four or none: the op takes the f32 values
// and the bf16 flag. Every op must match exactly (Prim, params, bodies, wiring) and nothing outside
// the chain may read its intermediates (nor may a caller keep one), or the chain stays as it is.
// A constant scale on the scores (s * c) becomes the op's scale. Around a match the rewrite then
// takes, each all or nothing: a constant scale on q (times the op's scale); grouped-query repeats
// of k and v (the op's kv_groups), and otherwise the heads' permutes [0, 2, 1, 3] of q, k, v and o
// (the op works with heads inside) and then a fused projection's split into q, k, v (the op reads
// the packed value, and its VJP writes the packed gradient); see absorb_scale_and_heads.
//
// Two callers: Engine::backward rewrites the recording in place before the
// sweep (fuse_attention_in_place), and the pipeline's pass (fuse_attention) rewrites chains no
// backward followed: an evaluation step, or a chain recorded after the last backward().
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
  int64_t packed_heads = 0;                   // > 0: q, k, v are one packed value
  int64_t kv_groups = 1;                      // > 1: k and v have a head for each group of that many query heads
  ValueId q = kNoValue, k = kNoValue, v = kNoValue, o = kNoValue;
  bool bf16 = false;                                    // the products read bf16 casts:
  ValueId qp = kNoValue, kp = kNoValue, vp = kNoValue;  // the values they read (q, k, v without)
  std::vector<int32_t> forward;                         // op indices
  int32_t o_op = -1;  // the op computing the product with v: attention takes its place
};

class Matcher {
 public:
  // keep: values read after the rewrite (requested outputs, handles). wrt: values the caller
  // differentiates for; a mask that depends on one is left unfused (attention gives it no gradient).
  Matcher(const Circuit& c, const std::vector<ValueId>& keep, const std::vector<ValueId>& wrt)
      : c_(c), readers_(value_readers(c)), protected_(c.num_values(), false), depends_on_wrt_(c.num_values(), false) {
    for (ValueId o : keep) protected_[static_cast<size_t>(o)] = true;
    for (ValueId w : wrt) depends_on_wrt_[static_cast<size_t>(w)] = true;
    for (const Op& op : c.ops()) {
      bool any = false;
      for (size_t k = 0; k < op.inputs.size(); ++k) {
        const auto& nd = op.prim->nondiff_inputs;
        any = any || (std::find(nd.begin(), nd.end(), static_cast<int>(k)) == nd.end() &&
                      depends_on_wrt_[static_cast<size_t>(op.inputs[k])]);
      }
      for (ValueId o : op.outputs)
        depends_on_wrt_[static_cast<size_t>(o)] = depends_on_wrt_[static_cast<size_t>(o)] || any;
    }
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

    // Nothing outside the chain reads its intermediates.
    for (ValueId x : internal)
      for (int32_t r2 : readers_[static_cast<size_t>(x)])
        if (!in(mt.forward, r2)) return std::nullopt;
    absorb_scale_and_heads(mt);
    if (!mask_from_outside(mt) || (mt.mask != kNoValue && depends_on_wrt_[static_cast<size_t>(mt.mask)]))
      return std::nullopt;
    // One op in two roles (a bf16 cast read as both k and v) is listed once.
    std::sort(mt.forward.begin(), mt.forward.end());
    mt.forward.erase(std::unique(mt.forward.begin(), mt.forward.end()), mt.forward.end());
    return mt;
  }

 private:
  // The additive mask (if any) is made by no op the match removes (a value of the chain itself,
  // or one it absorbs, added to the scores would have nothing to be read from).
  bool mask_from_outside(const Match& mt) const {
    if (mt.mask == kNoValue) return true;
    const int32_t p = producer_index(mt.mask);
    return p < 0 || !in(mt.forward, p);
  }

  // Widens a match where the chain around it allows, all or nothing for each step:
  //  - a constant scale on q, q = x * c, becomes the op's scale, so attention reads x;
  //  - q, k and v that are permute(y, [0, 2, 1, 3]) of (B, T, H, d) values y, and o read only by
  //    such a permute: the op works with heads inside and reads and writes the (B, T, H, d)
  //    values, with no permute left to run.
  void absorb_scale_and_heads(Match& mt) const {
    if (mt.q == mt.k || mt.q == mt.v || mt.k == mt.v) return;  // one value in two roles: keep it as it is
    // The scale on q (times any scale on the scores).
    if (const Op* scale = producer(mt.q, PrimId::pointwise);
        scale && times_constant(*scale) && reads_only_chain(mt, mt.q)) {
      mt.scale *= *times_constant(*scale);
      mt.forward.push_back(producer_index(mt.q));
      mt.q = scale->inputs[0];
    }
    // Grouped queries: k and v repeated for each query head of a group. The op reads them
    // unrepeated (and its VJP sums dk, dv over the group); the heads stay among the batch dims.
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
    mt.heads_inside = true;
    for (const Op* p : {pq, pk, pv, po}) mt.forward.push_back(index_of(p));
    mt.q = pq->inputs[0];
    mt.k = pk->inputs[0];
    mt.v = pv->inputs[0];
    mt.o = po->outputs[0];
    absorb_packing(mt);
  }

  // With heads inside: q, k and v that are the pieces of one split of a fused projection's
  // (B, T, 3 H d) output (each reshaped to (B, T, H, d)): the op reads the packed value.
  void absorb_packing(Match& mt) const {
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
    mt.packed_heads = piece[2];
    for (const Op* o : {split, rq, rk, rv}) mt.forward.push_back(index_of(o));
    mt.q = mt.k = mt.v = split->inputs[0];
  }

  // k and v that are repeat_kv_heads(x, H) of (B, H / G, T, d) values x (reshape to
  // (B, H / G, 1, T, d), broadcast to (B, H / G, G, T, d), reshape to (B, H, T, d)), both with one
  // G > 1: the op takes x with kv_groups G.
  bool absorb_kv_repeat(Match& mt) const {
    struct Repeat {
      const Op *first, *broadcast, *last;
    };
    const Shape& qs = c_.info(mt.q).shape;
    if (qs.rank() != 4) return false;
    int64_t groups = 0;
    auto repeat_of = [&](ValueId x) -> std::optional<Repeat> {
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
      groups = g;
      return r;
    };
    const std::optional<Repeat> rk = repeat_of(mt.k), rv = repeat_of(mt.v);
    if (!rk || !rv) return false;
    mt.kv_groups = groups;
    for (const Repeat* r : {&*rk, &*rv})
      for (const Op* o : {r->first, r->broadcast, r->last}) mt.forward.push_back(index_of(o));
    mt.k = rk->first->inputs[0];
    mt.v = rv->first->inputs[0];
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
      if (!in(mt.forward, r)) return false;
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

  const Op& op(int32_t i) const { return c_.ops()[static_cast<size_t>(i)]; }
  int32_t producer_index(ValueId v) const { return c_.value(v).producer; }
  const Op* producer(ValueId v, PrimId prim) const {
    const int32_t p = c_.value(v).producer;
    return p >= 0 && op(p).is(prim) ? &op(p) : nullptr;
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
  std::vector<bool> protected_;       // values read after the rewrite
  std::vector<bool> depends_on_wrt_;  // values the caller's gradients flow through
};

}  // namespace

size_t fuse_attention_in_place(Circuit& c, const std::vector<ValueId>& keep, const std::vector<ValueId>& wrt) {
  std::vector<Match> matches;
  {
    Matcher matcher(c, keep, wrt);
    std::vector<bool> taken(c.ops().size(), false);  // ops of an earlier match
    for (size_t i = 0; i < c.ops().size(); ++i) {
      std::optional<Match> mt = matcher.match(static_cast<int32_t>(i));
      if (!mt ||
          std::any_of(mt->forward.begin(), mt->forward.end(), [&](int32_t f) { return taken[static_cast<size_t>(f)]; }))
        continue;
      for (int32_t f : mt->forward) taken[static_cast<size_t>(f)] = true;
      matches.push_back(std::move(*mt));
    }
  }
  // Each chain's ops go; the attention op takes the place of the product with v (every input
  // is defined before it, every reader of o comes after) and keeps o's id.
  std::vector<OpReplacement> replacements;
  for (const Match& mt : matches) {
    OpReplacement r;
    r.removed = mt.forward;
    r.at = mt.o_op;
    r.prim = &PrimRegistry::instance().get(PrimId::attention);
    r.params = AttentionParams{mt.causal,    mt.scale, mt.heads_inside,     mt.packed_heads,
                               mt.kv_groups, mt.keep,  mt.mask != kNoValue, mt.bf16}
                   .to_params();
    // q, k, v (or the packed value), then the mask and the dropout stream
    r.inputs = mt.packed_heads > 0 ? std::vector<ValueId>{mt.q} : std::vector<ValueId>{mt.q, mt.k, mt.v};
    if (mt.mask != kNoValue) r.inputs.push_back(mt.mask);
    if (mt.keep < 1.0) {
      r.inputs.push_back(mt.key);
      r.inputs.push_back(mt.offset);
    }
    r.kept = {mt.o};
    replacements.push_back(std::move(r));
  }
  if (!replacements.empty()) c.replace_ops(replacements);
  return replacements.size();
}

Circuit fuse_attention(const Circuit& c, std::vector<ValueId>& outputs) {
  Circuit out = c;
  if (fuse_attention_in_place(out, outputs) == 0) return c;
  return dce(out, outputs);
}

}  // namespace kiln
