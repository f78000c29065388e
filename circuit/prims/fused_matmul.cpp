// Prim family `fused_matmul`: a batched matmul with strided operand views, operand prologues
// and epilogues (see circuit/prims/fused_matmul.hpp for the program and shape contract). The matmul
// fusion pass builds it after AD, so the Prim has no VJP rule. Reference: each operand is
// gathered through its view and prologue into a contiguous (batch..., rows, K) tensor, one
// Eigen GEMM per batch entry accumulates, then each epilogue runs as a pointwise body over
// (accumulator, extras) and is stored through the output layout.
#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include <kiln/circuit/ir/bf16.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/body_eval.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>

namespace kiln {

namespace {

std::vector<int64_t> take(const std::vector<int64_t>& v, size_t& at, size_t n) {
  if (at + n > v.size()) throw Error("fused_matmul: malformed params");
  std::vector<int64_t> r(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + n));
  at += n;
  return r;
}

std::string view_text(const MatmulOperand& v) {
  std::string s = fmt::format("[+{} batch {} row {} k {}]", v.offset, Shape(v.batch).str(), v.row_stride, v.k_stride);
  if (v.prologue != se::in(0)) s += fmt::format(" {{{}}}", v.prologue.str());
  return s;
}

}  // namespace

Shape FusedMatmul::block_sums_shape() const {
  std::vector<int64_t> d = batch;
  d.push_back((m + kBlockSumRows - 1) / kBlockSumRows);
  d.push_back(n);
  return Shape(d);
}

Shape FusedMatmul::logical() const {
  std::vector<int64_t> d = batch;
  d.push_back(m);
  d.push_back(n);
  return Shape(d);
}

FusedMatmul FusedMatmul::plain(const Shape& a, const Shape& b, bool ta, bool tb) {
  const int ra = a.rank(), rb = b.rank();
  FusedMatmul f;
  f.m = ta ? a[ra - 1] : a[ra - 2];
  f.k = ta ? a[ra - 2] : a[ra - 1];
  f.n = tb ? b[rb - 2] : b[rb - 1];
  const Shape a_batch(std::vector<int64_t>(a.dims().begin(), a.dims().end() - 2));
  const Shape b_batch(std::vector<int64_t>(b.dims().begin(), b.dims().end() - 2));
  f.batch = broadcast_shapes(a_batch, b_batch, "matmul").dims();
  const Shape logical_batch(f.batch);
  auto operand = [&](const Shape& s, const Shape& s_batch, bool contiguous_k, int64_t rows) {
    MatmulOperand v;
    const int64_t matrix = s[s.rank() - 1] * s[s.rank() - 2];
    v.batch = ref::broadcast_strides(s_batch, logical_batch);
    for (int64_t& st : v.batch) st *= matrix;
    v.row_stride = contiguous_k ? f.k : 1;
    v.k_stride = contiguous_k ? 1 : rows;
    return v;
  };
  f.a = operand(a, a_batch, !ta, f.m);
  f.b = operand(b, b_batch, tb, f.n);
  f.out_shape = f.logical();
  f.out_batch = ref::broadcast_strides(logical_batch, logical_batch);
  for (int64_t& st : f.out_batch) st *= f.m * f.n;
  f.out_row = f.n;
  f.out_col = 1;
  return f;
}

// ints: {nb, batch (nb), m, n, k, then per operand {offset, batch strides (nb), row, k},
//        out rank, out shape, out batch strides (nb), out row, out col, extras,
//        a_row_sums, block_sums, then (with a_row_sums) row sums rank and shape, then (where any
//        epilogue is stored as bf16) a 0/1 flag per epilogue};
// bodies: {a's prologue, b's prologue, epilogues..., (with block_sums) its body}.
Params FusedMatmul::to_params(DType dtype) const {
  Params p;
  p.dtype = dtype;
  auto& v = p.ints;
  v.push_back(static_cast<int64_t>(batch.size()));
  v.insert(v.end(), batch.begin(), batch.end());
  v.insert(v.end(), {m, n, k});
  for (const MatmulOperand* o : {&a, &b}) {
    v.push_back(o->offset);
    v.insert(v.end(), o->batch.begin(), o->batch.end());
    v.insert(v.end(), {o->row_stride, o->k_stride});
  }
  v.push_back(out_shape.rank());
  v.insert(v.end(), out_shape.dims().begin(), out_shape.dims().end());
  v.insert(v.end(), out_batch.begin(), out_batch.end());
  v.insert(v.end(), {out_row, out_col, extras, a_row_sums ? 1 : 0, block_sums ? 1 : 0});
  if (a_row_sums) {
    v.push_back(row_sums_shape.rank());
    v.insert(v.end(), row_sums_shape.dims().begin(), row_sums_shape.dims().end());
  }
  // Trailing, where any epilogue is stored as bf16: a flag per epilogue.
  bool any_bf16 = false;
  for (size_t r = 0; r < epilogues.size(); ++r) any_bf16 = any_bf16 || stored_bf16(r);
  if (any_bf16)
    for (size_t r = 0; r < epilogues.size(); ++r) v.push_back(stored_bf16(r) ? 1 : 0);
  p.bodies = {a.prologue, b.prologue};
  p.bodies.insert(p.bodies.end(), epilogues.begin(), epilogues.end());
  if (block_sums) p.bodies.push_back(block_sums_body);
  return p;
}

FusedMatmul FusedMatmul::from_params(const Params& p) {
  const auto& v = p.ints;
  if (v.empty() || v[0] < 0 || p.bodies.size() < 3) throw Error("fused_matmul: malformed params");
  FusedMatmul f;
  size_t at = 1;
  const auto nb = static_cast<size_t>(v[0]);
  f.batch = take(v, at, nb);
  const std::vector<int64_t> mnk = take(v, at, 3);
  f.m = mnk[0], f.n = mnk[1], f.k = mnk[2];
  for (MatmulOperand* o : {&f.a, &f.b}) {
    o->offset = take(v, at, 1)[0];
    o->batch = take(v, at, nb);
    const std::vector<int64_t> rk = take(v, at, 2);
    o->row_stride = rk[0], o->k_stride = rk[1];
  }
  const int64_t out_rank = take(v, at, 1)[0];
  if (out_rank < 0) throw Error("fused_matmul: malformed params");
  f.out_shape = Shape(take(v, at, static_cast<size_t>(out_rank)));
  f.out_batch = take(v, at, nb);
  const std::vector<int64_t> tail = take(v, at, 5);
  f.out_row = tail[0], f.out_col = tail[1], f.extras = static_cast<int>(tail[2]), f.a_row_sums = tail[3] != 0;
  f.block_sums = tail[4] != 0;
  if (f.a_row_sums) {
    const int64_t rank = take(v, at, 1)[0];
    if (rank < 0) throw Error("fused_matmul: malformed params");
    f.row_sums_shape = Shape(take(v, at, static_cast<size_t>(rank)));
  }
  f.a.prologue = p.bodies[0];
  f.b.prologue = p.bodies[1];
  if (f.block_sums && p.bodies.size() < 4) throw Error("fused_matmul: malformed params (no block sums body)");
  f.epilogues.assign(p.bodies.begin() + 2, p.bodies.end() - (f.block_sums ? 1 : 0));
  if (f.block_sums) f.block_sums_body = p.bodies.back();
  if (at < v.size())
    for (int64_t flag : take(v, at, f.epilogues.size())) {
      if (flag != 0 && flag != 1) throw Error("fused_matmul: malformed params (epilogue dtype flag)");
      f.epilogue_bf16.push_back(flag != 0);
    }
  if (at != v.size() || f.extras < 0) throw Error("fused_matmul: malformed params");
  return f;
}

std::string FusedMatmul::describe() const {
  std::string s =
      fmt::format("{} x {} x {} (batch {}) a{} b{}", m, n, k, Shape(batch).str(), view_text(a), view_text(b));
  if (out_shape != logical() || out_row != n || out_col != 1)
    s += fmt::format(" out{} [batch {} row {} col {}]", out_shape.str(), Shape(out_batch).str(), out_row, out_col);
  for (size_t r = 0; r < epilogues.size(); ++r)
    s += fmt::format(" out{}{}={{{}}}", r, stored_bf16(r) ? ":bf16" : "", epilogues[r].str());
  if (a_row_sums) s += fmt::format(" out{}=row sums of a {}", epilogues.size(), row_sums_shape.str());
  if (block_sums)
    s += fmt::format(" out{}=sums of {{{}}} over {} rows {}", epilogues.size(), block_sums_body.str(), kBlockSumRows,
                     block_sums_shape().str());
  return s;
}

namespace {

// Largest element index a view reaches (strides are non-negative).
int64_t last_index(int64_t offset, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  int64_t last = offset;
  for (size_t d = 0; d < dims.size(); ++d) last += (dims[d] - 1) * strides[d];
  return last;
}

// True if the strides place every element of `dims` at a distinct index in [0, numel): sorted
// by stride, each dim must step past everything the smaller dims span.
bool is_permutation_layout(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  std::vector<std::pair<int64_t, int64_t>> by_stride;  // (stride, dim) for dims of size > 1
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d] > 1) by_stride.emplace_back(strides[d], dims[d]);
  std::sort(by_stride.begin(), by_stride.end());
  int64_t span = 1;  // elements covered by the smaller dims
  for (const auto& [stride, dim] : by_stride) {
    if (stride != span) return false;
    span *= dim;
  }
  return true;
}

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  FusedMatmul f;
  try {
    f = FusedMatmul::from_params(p);
  } catch (const Error& e) {
    ctx.fail(e.what());
  }
  if (in.size() != static_cast<size_t>(2 + f.extras))
    ctx.fail(fmt::format("takes a, b and {} extra inputs; {} inputs were given", f.extras, in.size()));
  if (p.dtype != DType::f32 && p.dtype != DType::f64) ctx.fail("result dtype must be f32 or f64");
  // Each operand is of the result dtype, or bf16 under an f32 result (widened exactly, f32
  // accumulation; no prologue: it is read as stored); extra inputs are of the result dtype.
  for (size_t i = 0; i < in.size(); ++i) {
    const bool bf16_operand = i < 2 && p.dtype == DType::f32 && in[i].dtype == DType::bf16;
    if (in[i].dtype != p.dtype && !bf16_operand)
      ctx.fail(fmt::format("input {} is {}{}; every input must be {}{}", i, dtype_name(in[i].dtype), in[i].shape.str(),
                           dtype_name(p.dtype), i < 2 ? " (or bf16 under f32)" : ""));
    if (bf16_operand && (i == 0 ? f.a : f.b).prologue != se::in(0))
      ctx.fail(fmt::format("operand {} is bf16 and takes no prologue (it is read as stored)", i == 0 ? "a" : "b"));
  }
  if (f.m < 1 || f.n < 1 || f.k < 1) ctx.fail(fmt::format("needs m, n, k >= 1, received {}, {}, {}", f.m, f.n, f.k));
  ctx.require_dims(f.batch, "batch");
  const char* names[2] = {"a", "b"};
  const MatmulOperand* ops[2] = {&f.a, &f.b};
  for (int o = 0; o < 2; ++o) {
    const MatmulOperand& v = *ops[o];
    std::vector<int64_t> dims = f.batch, strides = v.batch;
    dims.insert(dims.end(), {o == 0 ? f.m : f.n, f.k});
    strides.insert(strides.end(), {v.row_stride, v.k_stride});
    bool negative = v.offset < 0;
    for (int64_t s : strides) negative = negative || s < 0;
    const int64_t last = last_index(v.offset, dims, strides);
    if (negative || last >= in[static_cast<size_t>(o)].shape.numel())
      ctx.fail(fmt::format("operand {}'s view {} reaches element {} of its base {} ({} elements)", names[o],
                           view_text(v), last, in[static_cast<size_t>(o)].shape.str(),
                           in[static_cast<size_t>(o)].shape.numel()));
    if (v.prologue.num_inputs() > 1) ctx.fail(fmt::format("prologue {} may read in0 only", v.prologue.str()));
  }
  std::vector<int64_t> out_strides = f.out_batch;
  out_strides.insert(out_strides.end(), {f.out_row, f.out_col});
  if (f.out_shape.numel() != f.logical().numel() || !is_permutation_layout(f.logical().dims(), out_strides))
    ctx.fail(fmt::format("output layout (strides {}) does not place the {} logical elements {} once each in {}",
                         Shape(out_strides).str(), f.logical().numel(), f.logical().str(), f.out_shape.str()));
  for (int j = 0; j < f.extras; ++j) {
    const Shape& s = in[static_cast<size_t>(2 + j)].shape;
    bool ok = true;
    try {
      ok = broadcast_shapes(s, f.logical(), "fused_matmul") == f.logical();
    } catch (const Error&) {
      ok = false;
    }
    if (!ok) ctx.fail(fmt::format("extra input {} {} does not broadcast to {}", j, s.str(), f.logical().str()));
  }
  if (f.epilogues.empty()) ctx.fail("needs at least one epilogue (in0: the product itself)");
  for (const ScalarExp& e : f.epilogues)
    if (e.num_inputs() > 1 + f.extras)
      ctx.fail(fmt::format("epilogue {} reads past in0 and the {} extra inputs", e.str(), f.extras));
  std::vector<ValueInfo> outs;
  for (size_t r = 0; r < f.epilogues.size(); ++r) {
    if (f.stored_bf16(r) && p.dtype != DType::f32)
      ctx.fail(fmt::format("epilogue {} is stored as bf16, which needs an f32 op", r));
    outs.push_back(ValueInfo{f.out_shape, f.stored_bf16(r) ? DType::bf16 : p.dtype});
  }
  if (f.block_sums) {
    if (f.a_row_sums) ctx.fail("takes row sums of a or block sums, not both");
    if (f.block_sums_body.num_inputs() > 1 + f.extras)
      ctx.fail(
          fmt::format("block sums body {} reads past in0 and the {} extra inputs", f.block_sums_body.str(), f.extras));
  }
  if (f.a_row_sums) {
    const int64_t want = Shape(f.batch).numel() * f.m;
    if (f.row_sums_shape.numel() != want)
      ctx.fail(fmt::format("row sums of a {} must have batch x m = {} elements", f.row_sums_shape.str(), want));
    outs.push_back(ValueInfo{f.row_sums_shape, p.dtype});
  }
  if (f.block_sums) outs.push_back(ValueInfo{f.block_sums_shape(), p.dtype});
  return outs;
}

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Operand `v` of logical batch `batch`, gathered into (batch..., rows, k), prologue applied.
template <class T>
HostTensor gather_operand(const HostTensor& base, const MatmulOperand& v, const std::vector<int64_t>& batch,
                          int64_t rows, int64_t k, EvalBuffers& bufs) {
  std::vector<int64_t> dims = batch;
  dims.insert(dims.end(), {rows, k});
  const Shape shape(dims);
  HostTensor source = base;
  if (base.dtype() == DType::bf16) {  // exact f32 copies (the shape rule allows this under f32 only)
    source = bufs.scratch(DType::f32, base.shape());
    ref::bf16_to_f32_into(base, source);
  }
  HostTensor out = bufs.scratch(source.dtype(), shape);
  const T* src = source.data<T>();
  T* dst = out.data<T>();
  const int64_t entries = Shape(batch).numel();
  for (int64_t e = 0; e < entries; ++e) {
    int64_t off = v.offset, rest = e;
    for (size_t d = batch.size(); d-- > 0;) {
      off += (rest % batch[d]) * v.batch[d];
      rest /= batch[d];
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c) *dst++ = src[off + r * v.row_stride + c * v.k_stride];
  }
  if (v.prologue == se::in(0)) return out;
  HostTensor applied = bufs.scratch(source.dtype(), shape);
  ref::run_all(ref::BodyRunner<T>(v.prologue, {&out}, shape), applied.data<T>(), shape.numel());
  return applied;
}

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const FusedMatmul f = FusedMatmul::from_params(op.params);
  const Shape logical = f.logical();
  std::vector<HostTensor> outs;
  ref::dispatch_float(op.params.dtype, "fused_matmul", [&](auto t) {
    using T = decltype(t);
    const HostTensor a = gather_operand<T>(*in[0], f.a, f.batch, f.m, f.k, bufs);
    const HostTensor b = gather_operand<T>(*in[1], f.b, f.batch, f.n, f.k, bufs);
    HostTensor acc = bufs.scratch(op.params.dtype, logical);
    const int64_t entries = Shape(f.batch).numel();
    auto gemm = [&](int64_t e) {
      Eigen::Map<const RowMat<T>> A(a.data<T>() + e * f.m * f.k, f.m, f.k), B(b.data<T>() + e * f.n * f.k, f.n, f.k);
      Eigen::Map<RowMat<T>> C(acc.data<T>() + e * f.m * f.n, f.m, f.n);
      C.noalias() = A * B.transpose();
    };
    if (entries == 1) {
      gemm(0);  // outside a parallel region, so that Eigen threads the GEMM itself
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t e = 0; e < entries; ++e) gemm(e);
    }
    std::vector<const HostTensor*> body_inputs{&acc};
    for (int j = 0; j < f.extras; ++j) body_inputs.push_back(in[static_cast<size_t>(2 + j)]);
    std::vector<int64_t> out_strides = f.out_batch;
    out_strides.insert(out_strides.end(), {f.out_row, f.out_col});
    for (size_t r = 0; r < f.epilogues.size(); ++r) {
      HostTensor value = bufs.scratch(op.params.dtype, logical);
      ref::run_all(ref::BodyRunner<T>(f.epilogues[r], body_inputs, logical), value.data<T>(), logical.numel());
      HostTensor out = bufs.output(r);
      const T* src = value.data<T>();
      const std::vector<int64_t>& dims = logical.dims();
      auto scatter = [&](auto* dst, auto convert) {
        for (int64_t i = 0; i < logical.numel(); ++i) {
          int64_t at = 0, rest = i;
          for (size_t d = dims.size(); d-- > 0;) {
            at += (rest % dims[d]) * out_strides[d];
            rest /= dims[d];
          }
          dst[at] = convert(src[i]);
        }
      };
      if (f.stored_bf16(r))  // rounded to nearest even, as a cast to bf16
        scatter(out.data<Bf16>(), [](T x) { return f32_to_bf16(static_cast<float>(x)); });
      else
        scatter(out.data<T>(), [](T x) { return x; });
      outs.push_back(std::move(out));
    }
    if (f.a_row_sums) {  // a is gathered as (batch..., m, k), contiguous
      HostTensor sums = bufs.output(f.epilogues.size());
      Eigen::Map<const RowMat<T>> A(a.data<T>(), Shape(f.batch).numel() * f.m, f.k);
      Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(sums.data<T>(), A.rows()) = A.rowwise().sum();
      outs.push_back(std::move(sums));
    }
    if (f.block_sums) {  // the body over the logical domain, then each column's 128-row blocks
      HostTensor value = bufs.scratch(op.params.dtype, logical);
      ref::run_all(ref::BodyRunner<T>(f.block_sums_body, body_inputs, logical), value.data<T>(), logical.numel());
      HostTensor sums = bufs.output(f.epilogues.size());
      const int64_t blocks = f.block_sums_shape()[f.block_sums_shape().rank() - 2];
      const T* src = value.data<T>();
      T* dst = sums.data<T>();
      std::fill(dst, dst + sums.numel(), T(0));
      for (int64_t e = 0; e < entries; ++e)
        for (int64_t row = 0; row < f.m; ++row)
          for (int64_t j = 0; j < f.n; ++j)
            dst[(e * blocks + row / FusedMatmul::kBlockSumRows) * f.n + j] += src[(e * f.m + row) * f.n + j];
      outs.push_back(std::move(sums));
    }
  });
  return outs;
}

}  // namespace

void register_fused_matmul(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::fused_matmul;
  d.shape = shape_rule;
  d.eval = eval;
  d.describe = [](const Params& p) { return FusedMatmul::from_params(p).describe(); };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
