// Prim family `attention`: scaled dot-product attention as one op, forward and backward, which
// the attention fusion (circuit/passes/fuse_attention.cpp) builds from the matmul / causal mask /
// softmax / matmul chain a model records, and the chain's backward.
//
// attention(q, k, v) -> (o, lse). Shape contract: q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv),
// one float dtype, the same batch dims -> o (..., Tq, dv), lse (..., Tq, 1); or with heads_inside
// q (B, Tq, H, d), k (B, Tk, H, d), v (B, Tk, H, dv) -> o (B, Tq, H, dv), lse (B, H, Tq, 1): the
// layout of a projection split into heads, read without a permute. Params (AttentionParams):
// causal (key j is seen by query i only when j <= i, which needs Tq == Tk), heads_inside, scale.
// With s = scale q kᵀ (masked entries -inf): o = softmax(s) v, lse = the rows' log-sum-exp of s.
// The forward keeps lse so that its backward recomputes the probabilities exp(s - lse) instead of
// reading a stored (Tq, Tk) matrix.
//
// attention_grad(q, k, v, o, lse, do[, dlse]) -> (dq, dk, dv): the VJP of attention, with
// p = exp(s - lse), D = rowsum(do * o) - dlse, ds = p * (do vᵀ - D):
//   dq = scale ds k, dk = scale dsᵀ q, dv = pᵀ do.
// It has no VJP of its own (no second derivatives through attention).
//
// Reference: per batch entry (a head of a sequence) with the (Tq, Tk) block in a per-thread scratch
// slice, the entries split across the OpenMP team; each step is a plain Eigen expression.
#include <omp.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "circuit/ir/circuit.hpp"
#include "circuit/prims/builder.hpp"
#include "circuit/prims/eigen_util.hpp"
#include "circuit/prims/families.hpp"
#include "circuit/prims/prim_params.hpp"

namespace kiln {
namespace {

// Where the rows of a (batch entry, head) lie in q, k, v, o or a gradient of one: row i of entry e
// starts at base(e) + i * row_stride() and holds `cols` contiguous elements. Entries are the
// batch dims in order (heads inside: e = b * H + h).
struct Rows {
  int64_t entries = 0, heads = 1, t = 0, cols = 0;
  bool heads_inside = false;
  int64_t row_stride() const { return heads_inside ? heads * cols : cols; }
  int64_t base(int64_t e) const { return heads_inside ? ((e / heads) * t * heads + e % heads) * cols : e * t * cols; }
};

Rows rows_of(const Shape& s, bool heads_inside) {
  const int r = s.rank();
  if (heads_inside) return {s[0] * s[2], s[2], s[1], s[3], true};
  int64_t entries = 1;
  for (int a = 0; a < r - 2; ++a) entries *= s[a];
  return {entries, 1, s[r - 2], s[r - 1], false};
}

// The shape of o (cols dv) or of lse (cols 1, always (batch..., heads, T, 1)) for queries q.
Shape like_q(const Shape& q, bool heads_inside, int64_t cols, bool lse) {
  std::vector<int64_t> d = q.dims();
  if (heads_inside && lse) return Shape{q[0], q[2], q[1], 1};
  d.back() = cols;
  return Shape(d);
}

// Checks q, k, v (the first three inputs of both Prims); returns the params' view.
AttentionParams check_qkv(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (p.ints.size() != 2 || p.reals.size() != 1) ctx.fail("params must be {causal, heads_inside}, {scale}");
  const AttentionParams a{p.ints[0] != 0, p.reals[0], p.ints[1] != 0};
  const char* names[] = {"q", "k", "v"};
  for (size_t i = 0; i < 3; ++i) {
    ctx.require_float(in[i], names[i]);
    if (in[i].dtype != in[0].dtype)
      ctx.fail(fmt::format("q, k and v must share one dtype, received {} and {}", dtype_name(in[0].dtype),
                           dtype_name(in[i].dtype)));
    if (a.heads_inside ? in[i].shape.rank() != 4 : in[i].shape.rank() < 2)
      ctx.fail(fmt::format("{} must be {}, received {}", names[i], a.heads_inside ? "(B, T, H, d)" : "(..., T, d)",
                           in[i].shape.str()));
  }
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  const Rows rq = rows_of(q, a.heads_inside), rk = rows_of(k, a.heads_inside), rv = rows_of(v, a.heads_inside);
  const bool same_batch = a.heads_inside ? (k[0] == q[0] && v[0] == q[0] && k[2] == q[2] && v[2] == q[2])
                                         : (std::equal(q.dims().begin(), q.dims().end() - 2, k.dims().begin()) &&
                                            std::equal(q.dims().begin(), q.dims().end() - 2, v.dims().begin()) &&
                                            k.rank() == q.rank() && v.rank() == q.rank());
  if (!same_batch)
    ctx.fail("q, k and v must have the same batch dims and heads, received q " + q.str() + ", k " + k.str() + ", v " +
             v.str());
  if (rk.cols != rq.cols) ctx.fail("q and k must have the same head size, received q " + q.str() + " and k " + k.str());
  if (rv.t != rk.t) ctx.fail("k and v must have the same number of keys, received k " + k.str() + " and v " + v.str());
  if (a.causal && rq.t != rk.t)
    ctx.fail("causal attention needs as many queries as keys, received q " + q.str() + " and k " + k.str());
  return a;
}

std::vector<ValueInfo> forward_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 3) ctx.fail("takes q, k and v");
  const AttentionParams a = check_qkv(ctx, in, p);
  const int64_t dv = rows_of(in[2].shape, a.heads_inside).cols;
  return {{like_q(in[0].shape, a.heads_inside, dv, false), in[0].dtype},
          {like_q(in[0].shape, a.heads_inside, 1, true), in[0].dtype}};
}

std::vector<ValueInfo> backward_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 6 && in.size() != 7) ctx.fail("takes q, k, v, o, lse, do and optionally dlse");
  const AttentionParams a = check_qkv(ctx, in, p);
  const int64_t dv = rows_of(in[2].shape, a.heads_inside).cols;
  const ValueInfo o{like_q(in[0].shape, a.heads_inside, dv, false), in[0].dtype},
      row{like_q(in[0].shape, a.heads_inside, 1, true), in[0].dtype};
  const char* names[] = {"o", "lse", "do", "dlse"};
  const ValueInfo* want[] = {&o, &row, &o, &row};
  for (size_t i = 3; i < in.size(); ++i)
    if (!(in[i] == *want[i - 3]))
      ctx.fail(fmt::format("{} must be {} {}, received {} {}", names[i - 3], dtype_name(want[i - 3]->dtype),
                           want[i - 3]->shape.str(), dtype_name(in[i].dtype), in[i].shape.str()));
  return {in[0], in[1], in[2]};
}

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Map = Eigen::Map<RowMat<T>>;
template <class T>
using RowsMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstRowsMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;

// Entry e's rows of a tensor laid out as `r`.
template <class T>
ConstRowsMap<T> entry(const HostTensor& x, const Rows& r, int64_t e) {
  return ConstRowsMap<T>(x.data<T>() + r.base(e), r.t, r.cols, Eigen::OuterStride<>(r.row_stride()));
}
template <class T>
RowsMap<T> entry(HostTensor& x, const Rows& r, int64_t e) {
  return RowsMap<T>(x.data<T>() + r.base(e), r.t, r.cols, Eigen::OuterStride<>(r.row_stride()));
}

// s = scale q kᵀ with the entries a causal mask hides at -inf, into `s` (tq x tk).
template <class T>
void scores(const ConstRowsMap<T>& q, const ConstRowsMap<T>& k, const AttentionParams& a, Map<T>& s) {
  s.noalias() = q * k.transpose();
  s *= static_cast<T>(a.scale);
  if (a.causal)
    for (int64_t i = 0; i < s.rows(); ++i) s.row(i).tail(s.cols() - i - 1).setConstant(-std::numeric_limits<T>::infinity());
}

// Calls f(entry, thread) for every batch entry, split across the OpenMP team.
template <class F>
void for_each_entry(int64_t entries, F&& f) {
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < entries; ++e) f(e, omp_get_thread_num());
}

std::vector<HostTensor> forward_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const AttentionParams a = AttentionParams::of(op);
  const Rows rq = rows_of(in[0]->shape(), a.heads_inside), rk = rows_of(in[1]->shape(), a.heads_inside),
             rv = rows_of(in[2]->shape(), a.heads_inside);
  HostTensor o = bufs.output(0), lse = bufs.output(1);
  const Rows ro = rows_of(o.shape(), a.heads_inside);
  ref::dispatch_float(in[0]->dtype(), "attention", [&](auto t) {
    using T = decltype(t);
    HostTensor scratch = bufs.scratch(in[0]->dtype(), Shape{omp_get_max_threads(), rq.t, rk.t});
    for_each_entry(rq.entries, [&](int64_t e, int thread) {
      Map<T> s(scratch.data<T>() + thread * rq.t * rk.t, rq.t, rk.t);
      Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>> row_lse(lse.data<T>() + e * rq.t, rq.t);
      scores<T>(entry<T>(*in[0], rq, e), entry<T>(*in[1], rk, e), a, s);
      for (int64_t i = 0; i < rq.t; ++i) {
        const T m = s.row(i).maxCoeff();
        s.row(i) = (s.row(i).array() - m).exp();
        const T l = s.row(i).sum();
        s.row(i) /= l;
        row_lse(i) = m + std::log(l);
      }
      entry<T>(o, ro, e).noalias() = s * entry<T>(*in[2], rv, e);
    });
  });
  return {o, lse};
}

std::vector<HostTensor> backward_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const AttentionParams a = AttentionParams::of(op);
  const Rows rq = rows_of(in[0]->shape(), a.heads_inside), rk = rows_of(in[1]->shape(), a.heads_inside),
             rv = rows_of(in[2]->shape(), a.heads_inside), ro = rows_of(in[3]->shape(), a.heads_inside);
  const bool has_dlse = in.size() == 7;
  HostTensor dq = bufs.output(0), dk = bufs.output(1), dvt = bufs.output(2);
  ref::dispatch_float(in[0]->dtype(), "attention_grad", [&](auto t) {
    using T = decltype(t);
    using Col = Eigen::Matrix<T, Eigen::Dynamic, 1>;
    HostTensor scratch = bufs.scratch(in[0]->dtype(), Shape{omp_get_max_threads(), 2, rq.t, rk.t});
    for_each_entry(rq.entries, [&](int64_t e, int thread) {
      const ConstRowsMap<T> q = entry<T>(*in[0], rq, e), k = entry<T>(*in[1], rk, e), v = entry<T>(*in[2], rv, e),
                            o = entry<T>(*in[3], ro, e), d_o = entry<T>(*in[5], ro, e);
      Eigen::Map<const Col> lse(in[4]->data<T>() + e * rq.t, rq.t);
      Map<T> p(scratch.data<T>() + (2 * thread) * rq.t * rk.t, rq.t, rk.t),
          ds(scratch.data<T>() + (2 * thread + 1) * rq.t * rk.t, rq.t, rk.t);
      scores(q, k, a, p);
      p = (p.array().colwise() - lse.array()).exp();  // exp(-inf) = 0 where masked
      Col rows_d = (d_o.array() * o.array()).rowwise().sum();
      if (has_dlse) rows_d -= Eigen::Map<const Col>(in[6]->data<T>() + e * rq.t, rq.t);
      ds.noalias() = d_o * v.transpose();
      ds = p.array() * (ds.array().colwise() - rows_d.array());
      entry<T>(dq, rq, e).noalias() = static_cast<T>(a.scale) * (ds * k);
      entry<T>(dk, rk, e).noalias() = static_cast<T>(a.scale) * (ds.transpose() * q);
      entry<T>(dvt, rv, e).noalias() = p.transpose() * d_o;
    });
  });
  return {dq, dk, dvt};
}

std::vector<ValueId> vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  if (g[0] == kNoValue && g[1] == kNoValue) return {kNoValue, kNoValue, kNoValue};
  const ValueId o = op.outputs[0];
  const ValueId d_o = g[0] != kNoValue ? g[0] : b.fill(b.info(o).shape, b.info(o).dtype, 0.0);
  std::vector<ValueId> inputs = {op.inputs[0], op.inputs[1], op.inputs[2], o, op.outputs[1], d_o};
  if (g[1] != kNoValue) inputs.push_back(g[1]);
  return b.circuit().add_op(PrimId::attention_grad, op.params, inputs, b.scope());
}

std::string describe(const Params& p) {
  return fmt::format("{}{}scale={}", p.ints[0] != 0 ? "causal " : "", p.ints[1] != 0 ? "(B, T, H, d) " : "",
                     p.reals[0]);
}

}  // namespace

AttentionParams AttentionParams::of(const Op& op) {
  require_view_of(op, {PrimId::attention, PrimId::attention_grad}, "AttentionParams");
  return {op.params.ints.at(0) != 0, op.params.reals.at(0), op.params.ints.at(1) != 0};
}

Params AttentionParams::to_params() const {
  Params p;
  p.ints = {causal ? 1 : 0, heads_inside ? 1 : 0};
  p.reals = {scale};
  return p;
}

void register_attention(PrimRegistry& r) {
  PrimDef fwd;
  fwd.id = PrimId::attention;
  fwd.shape = forward_shape;
  fwd.eval = forward_eval;
  fwd.vjp = vjp;
  fwd.describe = describe;
  r.add(std::move(fwd), __FILE__);
  PrimDef bwd;
  bwd.id = PrimId::attention_grad;
  bwd.shape = backward_shape;
  bwd.eval = backward_eval;
  bwd.describe = describe;
  r.add(std::move(bwd), __FILE__);
}

}  // namespace kiln
