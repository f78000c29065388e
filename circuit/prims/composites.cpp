// Composite functions recorded as Prims (see composites.hpp for the shape contracts).
#include <limits>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/composites.hpp>

namespace kiln::composite {

ValueId softmax(Builder& b, ValueId x) {
  ValueId m = b.stop_gradient(b.reduce(ReduceKind::Max, x, -1));
  ValueId e = b.pointwise(se::exp(se::in(0) - se::in(1)), {x, m});
  ValueId s = b.reduce(ReduceKind::Sum, e, -1);
  return b.div(e, s);
}

ValueId log_softmax(Builder& b, ValueId x) {
  ValueId m = b.stop_gradient(b.reduce(ReduceKind::Max, x, -1));
  ValueId shifted = b.sub(x, m);
  ValueId s = b.reduce(ReduceKind::Sum, b.pointwise(se::exp(se::in(0)), {shifted}), -1);
  return b.pointwise(se::in(0) - se::log(se::in(1)), {shifted, s});
}

ValueId layernorm(Builder& b, ValueId x, ValueId weight, ValueId bias, double eps) {
  ValueId mu = b.reduce(ReduceKind::Mean, x, -1);
  ValueId xc = b.sub(x, mu);
  ValueId var = b.reduce(ReduceKind::Mean, b.mul(xc, xc), -1);
  ValueId rstd = b.pointwise(se::rsqrt(se::in(0) + se::c(eps)), {var});
  return b.pointwise(se::in(0) * se::in(1) * se::in(2) + se::in(3), {xc, rstd, weight, bias});
}

ValueId cross_entropy(Builder& b, ValueId logits, ValueId targets) {
  const ValueInfo& li = b.info(logits);
  const ValueInfo& ti = b.info(targets);
  std::vector<int64_t> batch(li.shape.dims().begin(), li.shape.dims().end() - (li.shape.rank() > 0 ? 1 : 0));
  if (li.shape.rank() < 1 || Shape(batch) != ti.shape)
    fail(
        "cross_entropy", b.scope(),
        "logits must be (..., V) and targets (...): received logits " + li.shape.str() + ", targets " + ti.shape.str());
  // -log softmax(x)[t] = logsumexp(x) - x[t]: the target's logit is gathered (one element per
  // row; no one-hot of (..., V) is built), and the row's log-sum-exp needs only row sums.
  ValueId m = b.stop_gradient(b.reduce(ReduceKind::Max, logits, -1));
  ValueId s = b.reduce(ReduceKind::Sum, b.pointwise(se::exp(se::in(0) - se::in(1)), {logits, m}), -1);
  ValueId lse = b.pointwise(se::in(0) + se::log(se::in(1)), {m, s});
  return b.reduce_all(ReduceKind::Mean, b.sub(lse, b.gather_last(logits, targets)));
}

ValueId causal_mask(Builder& b, int64_t t) {
  return b.iota(Shape{t, t}, DType::i32, ix::ge(ix::coord(0), ix::coord(1)));
}

ValueId apply_causal_mask(Builder& b, ValueId scores) {
  const Shape& s = b.info(scores).shape;
  if (s.rank() < 2 || s[s.rank() - 1] != s[s.rank() - 2])
    fail("causal_mask", b.scope(), "scores must be (..., T, T), received " + s.str());
  ValueId mask = causal_mask(b, s[s.rank() - 1]);
  ValueId neg_inf = b.fill(Shape{}, b.info(scores).dtype, -std::numeric_limits<double>::infinity());
  return b.where(mask, scores, neg_inf);
}

ValueId dropout(Builder& b, ValueId x, double p, ValueId key, ValueId offset) {
  if (!(p >= 0.0 && p < 1.0)) fail("dropout", b.scope(), "p must lie in [0, 1), received " + std::to_string(p));
  const ValueInfo& xi = b.info(x);
  ValueId mask = b.random(RandomKind::Bernoulli, xi.shape, xi.dtype, key, offset, 1.0 - p);
  return b.pointwise(se::in(0) * se::in(1) * se::c(1.0 / (1.0 - p)), {x, mask});
}

}  // namespace kiln::composite
