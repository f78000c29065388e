// Prim family `attention`: scaled dot-product attention as one op, forward and backward. The
// attention rewrite (circuit/passes/fuse_attention.cpp) makes attention ops from the matmul / mask /
// softmax / dropout / matmul chain a model records, before differentiation; the reverse sweep
// then records attention's VJP, one attention_grad op.
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
// With kv_groups G > 1, q is (B, H, T, d) and k, v (B, H / G, T, d): query head h reads key/value
// head h / G, and dk, dv sum over the G query heads of their group.
//
// attention_grad(q, k, v, o, lse, do[, dlse]) -> (dq, dk, dv): the VJP of attention, with
// p = exp(s - lse), D = rowsum(do * o) - dlse, ds = p * (do vᵀ - D):
//   dq = scale ds k, dk = scale dsᵀ q, dv = pᵀ do.
// It has no VJP of its own (no second derivatives through attention).
//
// With an additive mask both ops take it after q, k, v (before any dropout stream): the scores
// are s = scale q kᵀ + mask (then the causal mask), the mask broadcast over the scores' shape
// (batch..., Tq, Tk) (with heads inside (B, H, Tq, Tk)). No gradient flows to it.
//
// With bf16 operands (the bf16 precision policy; f32 tensors) the ops read q, k, v and do rounded
// to bf16, r(x), and compute in f32 from there: s = scale r(q) r(k)ᵀ, o = (p F) r(v); backward
// dp = r(do) r(v)ᵀ, dv = (p F)ᵀ r(do), dq = scale ds r(k), dk = scale dsᵀ r(q), D = rowsum(do * o)
// from the f32 do and o. The probabilities and ds stay f32 inside the op (the unfused chain rounds
// them too, at its products' casts): the fused results are as close to exact as the unfused ones
// or closer (tests/test_fuse_attention.cpp measures both against f64).
//
// With bf16 copies (f32 ops; absorb_casts) each op also returns its main outputs (o; dq, dk, dv or
// the packed gradient) rounded to bf16 to nearest even, after its outputs: what the casts in front
// of the matmuls that read them gave.
//
// With dropout (keep < 1) both ops take (key, offset) after q, k, v (and the mask): attention(q, k, v, key,
// offset), attention_grad(q, k, v, key, offset, o, lse, do[, dlse]). With F the kept entries'
// factor (1 / keep, or 0 where dropped; AttentionParams says which bits): o = (softmax(s) * F) v,
// lse as without dropout, and in the backward ds = p * (F * (do vᵀ) - D), dv = (p * F)ᵀ do, where
// D = rowsum(do * o) - dlse still equals rowsum(p * F * (do vᵀ)) - dlse.
//
// Reference: per batch entry (a head of a sequence) with its (Tq, Tk) block in a per-thread scratch
// slice, the entries split across the OpenMP team; causal attention in blocks of 32 query rows
// against the keys they see; the products through oneDNN's sgemm (f32) or Eigen.
#if KILN_HAVE_DNNL
#include <dnnl.h>
#endif
#include <omp.h>
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/philox.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

// Where the rows of a (batch entry, head) lie in q, k, v, o or a gradient of one: row i of entry e
// starts at base(e) + i * row_stride() and holds `cols` contiguous elements. Entries are the
// batch dims in order (heads inside: e = b * H + h).
struct Rows {
  int64_t entries = 0, heads = 1, t = 0, cols = 0;
  bool heads_inside = false;
  int64_t stride = 0, offset = 0;  // heads inside: elements from one T step to the next; the first
  int64_t row_stride() const { return heads_inside ? stride : cols; }
  int64_t base(int64_t e) const {
    return heads_inside ? offset + (e / heads) * t * stride + (e % heads) * cols : e * t * cols;
  }
};

Rows rows_of(const Shape& s, bool heads_inside) {
  const int r = s.rank();
  if (heads_inside) return {s[0] * s[2], s[2], s[1], s[3], true, s[2] * s[3], 0};
  int64_t entries = 1;
  for (int a = 0; a < r - 2; ++a) entries *= s[a];
  return {entries, 1, s[r - 2], s[r - 1], false, s[r - 1], 0};
}

// Piece `piece` (0: q, 1: k, 2: v) of a packed (B, T, 3 H d) input, as (B, T, H, d) rows.
Rows packed_rows(const Shape& qkv, int64_t heads, int piece) {
  const int64_t c = qkv[2] / 3;
  return {qkv[0] * heads, heads, qkv[1], c / heads, true, qkv[2], piece * c};
}

// The (B, T, H, d) shape of one piece of a packed input.
Shape piece_shape(const Shape& qkv, int64_t heads) { return Shape{qkv[0], qkv[1], heads, qkv[2] / 3 / heads}; }

// Dropout on the probabilities: the stream (seed, offset) of the op's key and offset inputs.
struct Dropout {
  bool on = false;
  uint64_t seed = 0;
  uint32_t offset = 0;
  double keep = 1.0;
  // Row `row` (entry * Tq + query) of the factors over keys [0, n) of Tk: 1 / keep where
  // element row * Tk + j of the Bernoulli(keep) stream is kept, else 0; `bits` holds n words.
  template <class T>
  void factors(int64_t row, int64_t tk, int64_t n, uint32_t* bits, T* out) const {
    philox_bits_range(seed, offset, static_cast<uint64_t>(row) * static_cast<uint64_t>(tk), n, bits);
    const T kept = static_cast<T>(1.0 / keep);
    for (int64_t j = 0; j < n; ++j) out[j] = bits_to_uniform(bits[j]) < keep ? kept : T(0);
  }
};

// The scores' shape for q (unpacked) and tk keys: (batch..., Tq, Tk), or (B, H, Tq, Tk) with heads
// inside.
Shape scores_shape(const Shape& q, bool heads_inside, int64_t tk) {
  if (heads_inside) return Shape{q[0], q[2], q[1], tk};
  std::vector<int64_t> d = q.dims();
  d.back() = tk;
  return Shape(d);
}

// An additive mask broadcast over the scores: element (entry e, query i, key j) at
// base(e) + i * row_stride + j * col_stride (strides 0 along broadcast dims). Entries are the
// scores' batch dims in order, as Rows numbers them.
struct MaskView {
  const HostTensor* t = nullptr;
  std::vector<int64_t> batch, strides;  // the scores' batch dims; the mask's stride along each
  int64_t row_stride = 0, col_stride = 0;
  int64_t base(int64_t e) const {
    int64_t at = 0;
    for (size_t d = batch.size(); d-- > 0;) {
      at += (e % batch[d]) * strides[d];
      e /= batch[d];
    }
    return at;
  }
};
MaskView mask_view(const HostTensor* mask, const Shape& scores) {
  MaskView m;
  m.t = mask;
  const Shape& ms = mask->shape();
  const int r = scores.rank(), pad = r - ms.rank();
  std::vector<int64_t> stride(static_cast<size_t>(r), 0);
  int64_t step = 1;
  for (int d = r - 1; d >= pad; --d) {
    const int64_t n = ms[d - pad];
    stride[static_cast<size_t>(d)] = n == 1 ? 0 : step;
    step *= n;
  }
  m.batch.assign(scores.dims().begin(), scores.dims().end() - 2);
  m.strides.assign(stride.begin(), stride.end() - 2);
  m.row_stride = stride[static_cast<size_t>(r - 2)];
  m.col_stride = stride[static_cast<size_t>(r - 1)];
  return m;
}

// The op's q, k and v (their storage and rows), packed or not, its additive mask and dropout
// stream, and where its other inputs start.
struct Operands {
  const HostTensor *q, *k, *v;
  Rows rq, rk, rv;
  Dropout dropout;
  size_t rest;  // index of o (attention_grad)
  MaskView mask;
};
Operands operands_of(const std::vector<const HostTensor*>& in, const AttentionParams& a) {
  Operands x;
  size_t next = 3;
  if (a.packed_heads > 0) {
    const Shape& s = in[0]->shape();
    x = {in[0],
         in[0],
         in[0],
         packed_rows(s, a.packed_heads, 0),
         packed_rows(s, a.packed_heads, 1),
         packed_rows(s, a.packed_heads, 2),
         {},
         0,
         {}};
    next = 1;
  } else {
    x = {in[0],
         in[1],
         in[2],
         rows_of(in[0]->shape(), a.heads_inside),
         rows_of(in[1]->shape(), a.heads_inside),
         rows_of(in[2]->shape(), a.heads_inside),
         {},
         0,
         {}};
  }
  if (a.mask) {
    const Shape q = a.packed_heads > 0 ? piece_shape(in[0]->shape(), a.packed_heads) : in[0]->shape();
    x.mask = mask_view(in[next], scores_shape(q, a.heads_inside, x.rk.t));
    next += 1;
  }
  if (a.dropout()) {
    const int32_t* key = in[next]->data<int32_t>();
    x.dropout = {true, static_cast<uint32_t>(key[0]) | (static_cast<uint64_t>(static_cast<uint32_t>(key[1])) << 32),
                 static_cast<uint32_t>(in[next + 1]->data<int32_t>()[0]), a.keep};
    next += 2;
  }
  x.rest = next;
  return x;
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
  if (p.ints.size() != 7 || p.reals.size() != 2)
    ctx.fail("params must be {causal, heads_inside, packed_heads, kv_groups, mask, bf16, bf16_copies}, {scale, keep}");
  const AttentionParams a{p.ints[0] != 0, p.reals[0],     p.ints[1] != 0, p.ints[2],     p.ints[3],
                          p.reals[1],     p.ints[4] != 0, p.ints[5] != 0, p.ints[6] != 0};
  if (a.bf16 && in[0].dtype != DType::f32)
    ctx.fail(std::string("bf16 operands need f32 q, k and v, received ") + dtype_name(in[0].dtype));
  if (a.bf16_copies && in[0].dtype != DType::f32)
    ctx.fail(std::string("bf16 copies of the outputs need f32 q, k and v, received ") + dtype_name(in[0].dtype));
  if (a.kv_groups < 1) ctx.fail("kv_groups must be >= 1, received " + std::to_string(a.kv_groups));
  if (!(a.keep > 0.0 && a.keep <= 1.0))
    ctx.fail("the dropout keep probability must lie in (0, 1], received " + std::to_string(a.keep));
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
  if (k.rank() != q.rank() || v.rank() != q.rank())
    ctx.fail("q, k and v must have one rank, received q " + q.str() + ", k " + k.str() + ", v " + v.str());
  const Rows rq = rows_of(q, a.heads_inside), rk = rows_of(k, a.heads_inside), rv = rows_of(v, a.heads_inside);
  if (rk.t == 0 || rq.cols == 0)
    ctx.fail("needs at least one key and a head size of at least 1, received q " + q.str() + " and k " + k.str());
  if (a.kv_groups > 1) {  // (B, H, T, d) queries, (B, H / G, T, d) keys and values
    if (a.heads_inside || q.rank() != 4 || k.rank() != 4 || v.rank() != 4 || k[0] != q[0] || v[0] != q[0] ||
        v[1] != k[1] || k[1] * a.kv_groups != q[1])
      ctx.fail(
          fmt::format("grouped-query attention ({} query heads a key/value head) needs q (B, H, T, d) and k, v "
                      "(B, H / {}, T, d), received q {}, k {}, v {}",
                      a.kv_groups, a.kv_groups, q.str(), k.str(), v.str()));
  }
  const bool same_batch =
      a.kv_groups > 1 || (a.heads_inside ? (k[0] == q[0] && v[0] == q[0] && k[2] == q[2] && v[2] == q[2])
                                         : (std::equal(q.dims().begin(), q.dims().end() - 2, k.dims().begin()) &&
                                            std::equal(q.dims().begin(), q.dims().end() - 2, v.dims().begin())));
  if (!same_batch)
    ctx.fail("q, k and v must have the same batch dims and heads, received q " + q.str() + ", k " + k.str() + ", v " +
             v.str());
  if (rk.cols != rq.cols) ctx.fail("q and k must have the same head size, received q " + q.str() + " and k " + k.str());
  if (rv.t != rk.t) ctx.fail("k and v must have the same number of keys, received k " + k.str() + " and v " + v.str());
  if (a.causal && rq.t != rk.t)
    ctx.fail("causal attention needs as many queries as keys, received q " + q.str() + " and k " + k.str());
  return a;
}

// A packed op's inputs seen as q, k, v (then the rest): checks the packed input's shape.
std::vector<ValueInfo> unpacked(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  const int64_t heads = p.ints.size() == 7 ? p.ints[2] : 0;
  if (heads <= 0) return in;
  if (p.ints[1] == 0) ctx.fail("packed q, k and v need heads_inside");
  if (in.empty()) ctx.fail("takes the packed q, k and v");
  const Shape& s = in[0].shape;
  if (s.rank() != 3 || s[2] % (3 * heads) != 0)
    ctx.fail(fmt::format("packed q, k, v must be (B, T, 3 H d) with H = {}, received {}", heads, s.str()));
  std::vector<ValueInfo> out(3, ValueInfo{piece_shape(s, heads), in[0].dtype});
  out.insert(out.end(), in.begin() + 1, in.end());
  return out;
}

// The additive mask (if any) after q, k, v, then with dropout the stream's key and offset;
// returns the index of the input after them.
size_t check_mask_and_stream(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const AttentionParams& a) {
  size_t at = 3;
  if (a.mask) {
    if (in.size() <= at) ctx.fail("with a mask takes it after q, k and v");
    const ValueInfo& m = in[at];
    const Shape scores = scores_shape(in[0].shape, a.heads_inside, rows_of(in[1].shape, a.heads_inside).t);
    bool broadcasts = m.shape.rank() <= scores.rank();
    for (int d = 1; broadcasts && d <= m.shape.rank(); ++d)
      broadcasts = m.shape[m.shape.rank() - d] == 1 || m.shape[m.shape.rank() - d] == scores[scores.rank() - d];
    if (m.dtype != in[0].dtype || !broadcasts)
      ctx.fail(fmt::format("the additive mask must be {} and broadcast to the scores' shape {}, received {} {}",
                           dtype_name(in[0].dtype), scores.str(), dtype_name(m.dtype), m.shape.str()));
    ++at;
  }
  if (!a.dropout()) return at;
  if (in.size() < at + 2) ctx.fail("with dropout takes the stream's key and offset after q, k, v and any mask");
  ctx.require_dtype(in[at], DType::i32, "key");
  ctx.require_dtype(in[at + 1], DType::i32, "offset");
  if (in[at].shape != Shape{2} || in[at + 1].shape != Shape{})
    ctx.fail("the dropout stream needs a key [2] and an offset [], received " + in[at].shape.str() + " and " +
             in[at + 1].shape.str());
  return at + 2;
}

std::vector<ValueInfo> forward_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& packed, const Params& p) {
  const std::vector<ValueInfo> in = unpacked(ctx, packed, p);
  if (in.size() < 3) ctx.fail("takes q, k and v");
  const AttentionParams a = check_qkv(ctx, in, p);
  if (in.size() != check_mask_and_stream(ctx, in, a))
    ctx.fail(fmt::format("takes q, k, v{}{}", a.mask ? ", the mask" : "", a.dropout() ? ", key and offset" : ""));
  const int64_t dv = rows_of(in[2].shape, a.heads_inside).cols;
  std::vector<ValueInfo> out{{like_q(in[0].shape, a.heads_inside, dv, false), in[0].dtype},
                             {like_q(in[0].shape, a.heads_inside, 1, true), in[0].dtype}};
  if (a.bf16_copies) out.push_back({out[0].shape, DType::bf16});
  return out;
}

// The bf16 copies of outputs [0, main) after them (bf16_copies).
std::vector<ValueInfo> with_copies(std::vector<ValueInfo> out, size_t main) {
  for (size_t i = 0; i < main; ++i) out.push_back({out[i].shape, DType::bf16});
  return out;
}
std::vector<HostTensor> with_copies(std::vector<HostTensor> out, size_t main, EvalBuffers& bufs) {
  for (size_t i = 0; i < main; ++i) {
    HostTensor copy = bufs.output(out.size());
    const float* from = out[i].data<float>();
    Bf16* to = copy.data<Bf16>();
    for (int64_t e = 0; e < copy.numel(); ++e) to[e] = f32_to_bf16(from[e]);
    out.push_back(copy);
  }
  return out;
}

std::vector<ValueInfo> backward_shape(const ShapeCtx& ctx, const std::vector<ValueInfo>& packed, const Params& p) {
  const std::vector<ValueInfo> in = unpacked(ctx, packed, p);
  if (in.size() < 3) ctx.fail("takes q, k, v, o, lse, do and optionally dlse");
  const AttentionParams a = check_qkv(ctx, in, p);
  const size_t rest = check_mask_and_stream(ctx, in, a);
  if (in.size() != rest + 3 && in.size() != rest + 4)
    ctx.fail(fmt::format("takes q, k, v{}{}, o, lse, do and optionally dlse", a.mask ? ", the mask" : "",
                         a.dropout() ? ", key, offset" : ""));
  const int64_t dv = rows_of(in[2].shape, a.heads_inside).cols;
  const ValueInfo o{like_q(in[0].shape, a.heads_inside, dv, false), in[0].dtype},
      row{like_q(in[0].shape, a.heads_inside, 1, true), in[0].dtype};
  const char* names[] = {"o", "lse", "do", "dlse"};
  const ValueInfo* want[] = {&o, &row, &o, &row};
  for (size_t i = rest; i < in.size(); ++i)
    if (!(in[i] == *want[i - rest]))
      ctx.fail(fmt::format("{} must be {} {}, received {} {}", names[i - rest], dtype_name(want[i - rest]->dtype),
                           want[i - rest]->shape.str(), dtype_name(in[i].dtype), in[i].shape.str()));
  if (p.ints[2] > 0) return a.bf16_copies ? with_copies({packed[0]}, 1) : std::vector<ValueInfo>{packed[0]};
  return a.bf16_copies ? with_copies({in[0], in[1], in[2]}, 3) : std::vector<ValueInfo>{in[0], in[1], in[2]};
}

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Map = Eigen::Map<RowMat<T>>;
template <class T>
using ConstRowsMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;

// c (m x n, row stride ldc) = alpha op(a) op(b) (+ c with `accumulate`) for row-major a and b with
// row strides lda and ldb: oneDNN's sgemm for f32 where kiln was built with it (one thread inside the entries'
// parallel loop, as the matmul Prim's batched products), except small products with b
// transposed; Eigen's product otherwise.
template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
          T* c, int64_t ldc, bool accumulate = false) {
#if KILN_HAVE_DNNL
  // Small products with b transposed (q kᵀ, do vᵀ) stay with Eigen: oneDNN's sgemm took about
  // twice as long on them, one thread on the 2-core AMD VM (16 x 64 x 32: 1.74 against 0.95 us;
  // level from n = 128 on), and the attention makes hundreds of them a layer.
  if constexpr (std::is_same_v<T, float>) {
    const bool small_b_transposed = tb && !ta && n <= 64 && m * n * k <= 64 * 64 * 64;
    if (!small_b_transposed) {
      if (m == 0 || n == 0) return;
      if (k == 0) {  // an empty sum (and leading dimensions oneDNN would refuse)
        if (!accumulate)
          for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
        return;
      }
      if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c,
                     ldc) != dnnl_success)
        throw Error("op 'attention': oneDNN sgemm failed for " + std::to_string(m) + "x" + std::to_string(k) + " . " +
                    std::to_string(k) + "x" + std::to_string(n));
      return;
    }
  }
#endif
  using Stride = Eigen::OuterStride<>;
  Eigen::Map<const RowMat<T>, 0, Stride> A(a, ta ? k : m, ta ? m : k, Stride(lda)),
      B(b, tb ? n : k, tb ? k : n, Stride(ldb));
  Eigen::Map<RowMat<T>, 0, Stride> C(c, m, n, Stride(ldc));
  if (!accumulate) C.setZero();
  if (ta && tb)
    C.noalias() += alpha * (A.transpose() * B.transpose());
  else if (ta)
    C.noalias() += alpha * (A.transpose() * B);
  else if (tb)
    C.noalias() += alpha * (A * B.transpose());
  else
    C.noalias() += alpha * (A * B);
}

// Entry e's first element in a tensor laid out as `r` (its rows r.row_stride() elements apart).
template <class T>
const T* rows_at(const HostTensor& x, const Rows& r, int64_t e) {
  return x.data<T>() + r.base(e);
}
template <class T>
T* rows_at(HostTensor& x, const Rows& r, int64_t e) {
  return x.data<T>() + r.base(e);
}

// Causal attention runs in blocks of query rows, each against only the keys its last row sees
// (three quarters of the products and exps at T = 64, about half at large T); unmasked attention
// in one block. 32 rows: on a Zen 5 VM, 8% faster than 16 at 16x4x64x32 (fewer, larger
// products: 0.58 against 0.63 ms forward and backward) and 10% at 8x6x256x64; 64 is slower.
// The op's tuned KernelChoice may pick another size (attention_rows).
constexpr int64_t kCausalRows = 32;
struct RowBlock {
  int64_t first, rows, keys;  // query rows [first, first + rows) against keys [0, keys)
};
std::vector<RowBlock> row_blocks(const AttentionParams& a, int64_t tq, int64_t tk, const KernelChoice& choice) {
  if (!a.causal) return {{0, tq, tk}};
  const int64_t step = choice.attention_rows > 0 ? choice.attention_rows : kCausalRows;
  std::vector<RowBlock> blocks;
  for (int64_t r0 = 0; r0 < tq; r0 += step) {
    const int64_t r1 = std::min(tq, r0 + step);
    blocks.push_back({r0, r1 - r0, std::min(tk, r1)});
  }
  return blocks;
}

// s = scale q kᵀ (+ the additive mask) of block `blk` of query entry e against key entry ek, with
// the entries a causal mask hides at -inf, into `s` (blk.rows x blk.keys, contiguous).
template <class T>
void scores(const Operands& x, int64_t e, int64_t ek, const RowBlock& blk, const AttentionParams& a, Map<T>& s) {
  const Rows &rq = x.rq, &rk = x.rk;
  gemm<T>(false, true, blk.rows, blk.keys, rq.cols, static_cast<T>(a.scale),
          rows_at<T>(*x.q, rq, e) + blk.first * rq.row_stride(), rq.row_stride(), rows_at<T>(*x.k, rk, ek),
          rk.row_stride(), s.data(), blk.keys);
  if (a.mask) {
    const MaskView& m = x.mask;
    const T* first = m.t->data<T>() + m.base(e) + blk.first * m.row_stride;
    for (int64_t i = 0; i < blk.rows; ++i)
      for (int64_t j = 0; j < blk.keys; ++j) s(i, j) += first[i * m.row_stride + j * m.col_stride];
  }
  if (a.causal)
    for (int64_t i = 0; i < blk.rows; ++i) {
      const int64_t seen = blk.first + i + 1;  // keys [0, seen) are seen by query first + i
      if (seen < blk.keys) s.row(i).tail(blk.keys - seen).setConstant(-std::numeric_limits<T>::infinity());
    }
}

// Calls f(entry, thread) for every batch entry, split across the OpenMP team.
template <class F>
void for_each_entry(int64_t entries, F&& f) {
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < entries; ++e) f(e, omp_get_thread_num());
}

// x with every element rounded to bf16 (f32 tensors): the operand copies a bf16 op's products read.
HostTensor rounded_copy(const HostTensor& x, EvalBuffers& bufs) {
  HostTensor r = bufs.scratch(DType::f32, x.shape());
  const float* from = x.data<float>();
  float* to = r.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) to[i] = round_to_bf16(from[i]);
  return r;
}
// With bf16 operands: points q, k and v at rounded copies (one for a packed input), kept in `keep`.
void round_operands(Operands& x, EvalBuffers& bufs, std::vector<HostTensor>& keep) {
  keep.reserve(3);
  const HostTensor* from[3] = {x.q, x.k, x.v};
  const HostTensor** to[3] = {&x.q, &x.k, &x.v};
  for (int i = 0; i < 3; ++i) {
    if (i > 0 && from[i] == from[0]) {  // packed: the one copy
      *to[i] = &keep[0];
      continue;
    }
    keep.push_back(rounded_copy(*from[i], bufs));
    *to[i] = &keep.back();
  }
}

// A thread's row of dropout factors (Dropout::factors) in the op's scratch; unused without dropout.
template <class T>
class DropoutRow {
 public:
  DropoutRow(const Dropout& d, EvalBuffers& bufs, DType dtype, int64_t tk) : d_(d), tk_(tk) {
    if (!d.on) return;
    factors_ = bufs.scratch(dtype, Shape{omp_get_max_threads(), tk});
    bits_ = bufs.scratch(DType::i32, Shape{omp_get_max_threads(), tk});
  }
  // Keys [0, n) of row `row` (entry * Tq + query), for thread `thread`.
  Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> factors(int thread, int64_t row, int64_t tk, int64_t n) {
    T* out = factors_.data<T>() + thread * tk_;
    d_.factors(row, tk, n, reinterpret_cast<uint32_t*>(bits_.data<int32_t>() + thread * tk_), out);
    return {out, n};
  }

 private:
  const Dropout& d_;
  int64_t tk_;
  HostTensor factors_, bits_;
};

std::vector<HostTensor> forward_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const AttentionParams a = AttentionParams::of(op);
  Operands x = operands_of(in, a);
  std::vector<HostTensor> rounded;
  if (a.bf16) round_operands(x, bufs, rounded);
  const Rows &rq = x.rq, &rk = x.rk, &rv = x.rv;
  HostTensor o = bufs.output(0), lse = bufs.output(1);
  const Rows ro = rows_of(o.shape(), a.heads_inside);
  ref::dispatch_float(in[0]->dtype(), "attention", [&](auto t) {
    using T = decltype(t);
    HostTensor scratch = bufs.scratch(in[0]->dtype(), Shape{omp_get_max_threads(), rq.t, rk.t});
    DropoutRow<T> drop(x.dropout, bufs, in[0]->dtype(), rk.t);
    const std::vector<RowBlock> blocks = row_blocks(a, rq.t, rk.t, bufs.choice());
    for_each_entry(rq.entries, [&](int64_t e, int thread) {
      const int64_t ek = e / a.kv_groups;
      for (const RowBlock& blk : blocks) {
        Map<T> s(scratch.data<T>() + thread * rq.t * rk.t, blk.rows, blk.keys);
        scores<T>(x, e, ek, blk, a, s);
        for (int64_t i = 0; i < blk.rows; ++i) {
          const T m = s.row(i).maxCoeff();
          s.row(i) = (s.row(i).array() - m).exp();
          const T l = s.row(i).sum();
          s.row(i) /= l;
          const int64_t row = e * rq.t + blk.first + i;
          lse.data<T>()[row] = m + std::log(l);
          if (x.dropout.on) s.row(i).array() *= drop.factors(thread, row, rk.t, blk.keys).array();
        }
        gemm<T>(false, false, blk.rows, rv.cols, blk.keys, T(1), s.data(), blk.keys, rows_at<T>(*x.v, rv, ek),
                rv.row_stride(), rows_at<T>(o, ro, e) + blk.first * ro.row_stride(), ro.row_stride());
      }
    });
  });
  return a.bf16_copies ? with_copies({o, lse}, 1, bufs) : std::vector<HostTensor>{o, lse};
}

std::vector<HostTensor> backward_eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const AttentionParams a = AttentionParams::of(op);
  Operands x = operands_of(in, a);
  std::vector<HostTensor> rounded;
  if (a.bf16) round_operands(x, bufs, rounded);
  const Rows &rq = x.rq, &rk = x.rk, &rv = x.rv;
  const HostTensor &o_in = *in[x.rest], &lse_in = *in[x.rest + 1], &do_in = *in[x.rest + 2];
  // The do the products read (rounded with bf16 operands); D reads do itself.
  const HostTensor do_product = a.bf16 ? rounded_copy(do_in, bufs) : do_in;
  const Rows ro = rows_of(o_in.shape(), a.heads_inside);
  const bool has_dlse = in.size() == x.rest + 4;
  // Packed: dq, dk and dv are the pieces of the one output.
  HostTensor dq = bufs.output(0), dk = a.packed_heads > 0 ? dq : bufs.output(1),
             dvt = a.packed_heads > 0 ? dq : bufs.output(2);
  ref::dispatch_float(in[0]->dtype(), "attention_grad", [&](auto t) {
    using T = decltype(t);
    using Col = Eigen::Matrix<T, Eigen::Dynamic, 1>;
    HostTensor scratch = bufs.scratch(in[0]->dtype(), Shape{omp_get_max_threads(), 2, rq.t, rk.t});
    DropoutRow<T> drop(x.dropout, bufs, in[0]->dtype(), rk.t);
    const std::vector<RowBlock> blocks = row_blocks(a, rq.t, rk.t, bufs.choice());
    // A key/value entry at a time (its dk and dv sum over the query heads of its group). The
    // blocks run last first: the last one sees every key and writes dk and dv whole (for the
    // group's first head), the others add to the keys they see.
    for_each_entry(rk.entries, [&](int64_t ek, int thread) {
      const T scale = static_cast<T>(a.scale);
      for (int64_t g = 0; g < a.kv_groups; ++g) {
        const int64_t e = ek * a.kv_groups + g;
        for (auto blk = blocks.rbegin(); blk != blocks.rend(); ++blk) {
          const bool first_write = g == 0 && blk == blocks.rbegin();
          const int64_t rows = blk->rows, keys = blk->keys;
          const T *do_rows = rows_at<T>(do_in, ro, e) + blk->first * ro.row_stride(),
                  *o_rows = rows_at<T>(o_in, ro, e) + blk->first * ro.row_stride(),
                  *do_product_rows = rows_at<T>(do_product, ro, e) + blk->first * ro.row_stride();
          const ConstRowsMap<T> o(o_rows, rows, ro.cols, Eigen::OuterStride<>(ro.row_stride())),
              d_o(do_rows, rows, ro.cols, Eigen::OuterStride<>(ro.row_stride()));
          Eigen::Map<const Col> lse(lse_in.data<T>() + e * rq.t + blk->first, rows);
          Map<T> p(scratch.data<T>() + (2 * thread) * rq.t * rk.t, rows, keys),
              ds(scratch.data<T>() + (2 * thread + 1) * rq.t * rk.t, rows, keys);
          scores<T>(x, e, ek, *blk, a, p);
          // p = exp(s - lse) a row at a time, which Eigen vectorizes (exp(-inf) = 0 where masked).
          for (int64_t i = 0; i < rows; ++i) p.row(i) = (p.row(i).array() - lse(i)).exp();
          Col rows_d = (d_o.array() * o.array()).rowwise().sum();
          if (has_dlse) rows_d -= Eigen::Map<const Col>(in[x.rest + 3]->data<T>() + e * rq.t + blk->first, rows);
          gemm<T>(false, true, rows, keys, rv.cols, T(1), do_product_rows, ro.row_stride(), rows_at<T>(*x.v, rv, ek),
                  rv.row_stride(), ds.data(), keys);  // do vᵀ
          if (x.dropout.on) {                         // ds = p (F (do vᵀ) - D), and p F for dv
            for (int64_t i = 0; i < rows; ++i) {
              const auto f = drop.factors(thread, e * rq.t + blk->first + i, rk.t, keys).array();
              ds.row(i) = p.row(i).array() * (ds.row(i).array() * f - rows_d(i));
              p.row(i).array() *= f;
            }
          } else {
            ds = p.array() * (ds.array().colwise() - rows_d.array());
          }
          gemm<T>(false, false, rows, rq.cols, keys, scale, ds.data(), keys, rows_at<T>(*x.k, rk, ek), rk.row_stride(),
                  rows_at<T>(dq, rq, e) + blk->first * rq.row_stride(), rq.row_stride());  // dq = scale ds k
          gemm<T>(true, false, keys, rq.cols, rows, scale, ds.data(), keys,
                  rows_at<T>(*x.q, rq, e) + blk->first * rq.row_stride(), rq.row_stride(), rows_at<T>(dk, rk, ek),
                  rk.row_stride(), !first_write);  // dk (+)= scale dsᵀ q
          gemm<T>(true, false, keys, rv.cols, rows, T(1), p.data(), keys, do_product_rows, ro.row_stride(),
                  rows_at<T>(dvt, rv, ek), rv.row_stride(), !first_write);  // dv (+)= (p F)ᵀ do
        }
      }
    });
  });
  std::vector<HostTensor> out{dq};
  if (a.packed_heads == 0) out.insert(out.end(), {dk, dvt});
  return a.bf16_copies ? with_copies(out, out.size(), bufs) : out;
}

std::vector<ValueId> vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  if (g[0] == kNoValue && g[1] == kNoValue) return std::vector<ValueId>(op.inputs.size(), kNoValue);
  const ValueId o = op.outputs[0];
  const ValueId d_o = g[0] != kNoValue ? g[0] : b.fill(b.info(o).shape, b.info(o).dtype, 0.0);
  std::vector<ValueId> inputs = op.inputs;  // q, k, v, or the packed q, k, v (then key, offset)
  for (ValueId x : {o, op.outputs[1], d_o}) inputs.push_back(x);
  if (g[1] != kNoValue) inputs.push_back(g[1]);
  AttentionParams a = AttentionParams::of(op);
  a.bf16_copies = false;  // the gradients' f32 values only
  std::vector<ValueId> grads = b.circuit().add_op(PrimId::attention_grad, a.to_params(), inputs, b.scope());
  grads.resize(op.inputs.size(), kNoValue);  // none for the dropout stream
  return grads;
}

std::string describe(const Params& p) {
  return fmt::format("{}{}{}{}{}{}scale={}{}", p.ints[0] != 0 ? "causal " : "", p.ints[5] != 0 ? "bf16 operands " : "",
                     p.ints[6] != 0 ? "bf16 copies of the outputs " : "", p.ints[4] != 0 ? "additive mask " : "",
                     p.ints[1] != 0 ? "(B, T, H, d) " : "",
                     p.ints[2] > 0   ? fmt::format("packed qkv of {} heads ", p.ints[2])
                     : p.ints[3] > 1 ? fmt::format("{} query heads a kv head ", p.ints[3])
                                     : std::string(),
                     p.reals[0], p.reals[1] < 1.0 ? fmt::format(" dropout keep={}", p.reals[1]) : std::string());
}

}  // namespace

AttentionParams AttentionParams::of(const Op& op) {
  require_view_of(op, {PrimId::attention, PrimId::attention_grad}, "AttentionParams");
  return {op.params.ints.at(0) != 0, op.params.reals.at(0),     op.params.ints.at(1) != 0,
          op.params.ints.at(2),      op.params.ints.at(3),      op.params.reals.at(1),
          op.params.ints.at(4) != 0, op.params.ints.at(5) != 0, op.params.ints.at(6) != 0};
}

Params AttentionParams::to_params() const {
  Params p;
  p.ints = {causal ? 1 : 0, heads_inside ? 1 : 0, packed_heads,       kv_groups,
            mask ? 1 : 0,   bf16 ? 1 : 0,         bf16_copies ? 1 : 0};
  p.reals = {scale, keep};
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
