// Prim family `attention`: scaled dot-product attention as one op, forward and backward, which
// the attention fusion (circuit/passes/fuse_attention.cpp) builds from the matmul / causal mask /
// softmax / matmul chain a model records, and the chain's backward.
//
// attention(q, k, v) -> (o, lse). Shape contract: q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv),
// one float dtype, the same batch dims -> o (..., Tq, dv), lse (..., Tq, 1). Params: causal
// (ints[0]; key j is seen by query i only when j <= i, which needs Tq == Tk) and scale (reals[0]).
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

#include <cmath>
#include <limits>

#include "circuit/ir/circuit.hpp"
#include "circuit/prims/builder.hpp"
#include "circuit/prims/eigen_util.hpp"
#include "circuit/prims/families.hpp"
#include "circuit/prims/prim_params.hpp"

namespace kiln {
namespace {

Shape batch_of(const Shape& s) { return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 2)); }
int64_t rows_of(const Shape& s) { return s[s.rank() - 2]; }
int64_t cols_of(const Shape& s) { return s[s.rank() - 1]; }

Shape with_last_two(const Shape& batch, int64_t rows, int64_t cols) {
  std::vector<int64_t> d = batch.dims();
  d.push_back(rows);
  d.push_back(cols);
  return Shape(d);
}

// Checks q, k, v (the first three inputs of both Prims); returns the params' view.
AttentionParams check_qkv(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (p.ints.size() != 1 || p.reals.size() != 1) ctx.fail("params must be {causal}, {scale}");
  const AttentionParams a{p.ints[0] != 0, p.reals[0]};
  const char* names[] = {"q", "k", "v"};
  for (size_t i = 0; i < 3; ++i) {
    ctx.require_float(in[i], names[i]);
    if (in[i].dtype != in[0].dtype)
      ctx.fail(fmt::format("q, k and v must share one dtype, received {} and {}", dtype_name(in[0].dtype),
                           dtype_name(in[i].dtype)));
    if (in[i].shape.rank() < 2) ctx.fail(fmt::format("{} must be (..., T, d), received {}", names[i], in[i].shape.str()));
  }
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  if (batch_of(k) != batch_of(q) || batch_of(v) != batch_of(q))
    ctx.fail("q, k and v must have the same batch dims, received q " + q.str() + ", k " + k.str() + ", v " + v.str());
  if (cols_of(k) != cols_of(q))
    ctx.fail("q and k must have the same head size, received q " + q.str() + " and k " + k.str());
  if (rows_of(v) != rows_of(k))
    ctx.fail("k and v must have the same number of keys, received k " + k.str() + " and v " + v.str());
  if (a.causal && rows_of(q) != rows_of(k))
    ctx.fail("causal attention needs as many queries as keys, received q " + q.str() + " and k " + k.str());
  return a;
}

std::vector<ValueInfo> forward_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 3) ctx.fail("takes q, k and v");
  check_qkv(ctx, in, p);
  const Shape batch = batch_of(in[0].shape);
  const int64_t tq = rows_of(in[0].shape), dv = cols_of(in[2].shape);
  return {{with_last_two(batch, tq, dv), in[0].dtype}, {with_last_two(batch, tq, 1), in[0].dtype}};
}

std::vector<ValueInfo> backward_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 6 && in.size() != 7) ctx.fail("takes q, k, v, o, lse, do and optionally dlse");
  check_qkv(ctx, in, p);
  const Shape batch = batch_of(in[0].shape);
  const int64_t tq = rows_of(in[0].shape), dv = cols_of(in[2].shape);
  const ValueInfo o{with_last_two(batch, tq, dv), in[0].dtype}, row{with_last_two(batch, tq, 1), in[0].dtype};
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
using ConstMap = Eigen::Map<const RowMat<T>>;

// s = scale q kᵀ with the entries a causal mask hides at -inf, into `s` (tq x tk).
template <class T>
void scores(const ConstMap<T>& q, const ConstMap<T>& k, const AttentionParams& a, Map<T>& s) {
  s.noalias() = (static_cast<T>(a.scale) * q) * k.transpose();
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
  const Shape &qs = in[0]->shape(), &vs = in[2]->shape();
  const int64_t entries = batch_of(qs).numel(), tq = rows_of(qs), tk = rows_of(vs), d = cols_of(qs), dv = cols_of(vs);
  HostTensor o = bufs.output(0), lse = bufs.output(1);
  ref::dispatch_float(in[0]->dtype(), "attention", [&](auto t) {
    using T = decltype(t);
    HostTensor scratch = bufs.scratch(in[0]->dtype(), Shape{omp_get_max_threads(), tq, tk});
    for_each_entry(entries, [&](int64_t e, int thread) {
      ConstMap<T> q(in[0]->data<T>() + e * tq * d, tq, d), k(in[1]->data<T>() + e * tk * d, tk, d),
          v(in[2]->data<T>() + e * tk * dv, tk, dv);
      Map<T> s(scratch.data<T>() + thread * tq * tk, tq, tk), out(o.data<T>() + e * tq * dv, tq, dv);
      Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>> row_lse(lse.data<T>() + e * tq, tq);
      scores(q, k, a, s);
      for (int64_t i = 0; i < tq; ++i) {
        const T m = s.row(i).maxCoeff();
        s.row(i) = (s.row(i).array() - m).exp();
        const T l = s.row(i).sum();
        s.row(i) /= l;
        row_lse(i) = m + std::log(l);
      }
      out.noalias() = s * v;
    });
  });
  return {o, lse};
}

std::vector<HostTensor> backward_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const AttentionParams a = AttentionParams::of(op);
  const Shape &qs = in[0]->shape(), &vs = in[2]->shape();
  const int64_t entries = batch_of(qs).numel(), tq = rows_of(qs), tk = rows_of(vs), d = cols_of(qs), dv = cols_of(vs);
  const bool has_dlse = in.size() == 7;
  HostTensor dq = bufs.output(0), dk = bufs.output(1), dvt = bufs.output(2);
  ref::dispatch_float(in[0]->dtype(), "attention_grad", [&](auto t) {
    using T = decltype(t);
    using Col = Eigen::Matrix<T, Eigen::Dynamic, 1>;
    HostTensor scratch = bufs.scratch(in[0]->dtype(), Shape{omp_get_max_threads(), 2, tq, tk});
    for_each_entry(entries, [&](int64_t e, int thread) {
      ConstMap<T> q(in[0]->data<T>() + e * tq * d, tq, d), k(in[1]->data<T>() + e * tk * d, tk, d),
          v(in[2]->data<T>() + e * tk * dv, tk, dv), o(in[3]->data<T>() + e * tq * dv, tq, dv),
          d_o(in[5]->data<T>() + e * tq * dv, tq, dv);
      Eigen::Map<const Col> lse(in[4]->data<T>() + e * tq, tq);
      Map<T> p(scratch.data<T>() + (2 * thread) * tq * tk, tq, tk), ds(scratch.data<T>() + (2 * thread + 1) * tq * tk, tq, tk);
      scores(q, k, a, p);
      p = (p.array().colwise() - lse.array()).exp();  // exp(-inf) = 0 where masked
      Col rows_d = (d_o.array() * o.array()).rowwise().sum();
      if (has_dlse) rows_d -= Eigen::Map<const Col>(in[6]->data<T>() + e * tq, tq);
      ds.noalias() = d_o * v.transpose();
      ds = p.array() * (ds.array().colwise() - rows_d.array());
      Map<T>(dq.data<T>() + e * tq * d, tq, d).noalias() = static_cast<T>(a.scale) * (ds * k);
      Map<T>(dk.data<T>() + e * tk * d, tk, d).noalias() = static_cast<T>(a.scale) * (ds.transpose() * q);
      Map<T>(dvt.data<T>() + e * tk * dv, tk, dv).noalias() = p.transpose() * d_o;
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
  return fmt::format("{}scale={}", p.ints[0] != 0 ? "causal " : "", p.reals[0]);
}

}  // namespace

AttentionParams AttentionParams::of(const Op& op) {
  require_view_of(op, {PrimId::attention, PrimId::attention_grad}, "AttentionParams");
  return {op.params.ints.at(0) != 0, op.params.reals.at(0)};
}

Params AttentionParams::to_params() const {
  Params p;
  p.ints = {causal ? 1 : 0};
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
