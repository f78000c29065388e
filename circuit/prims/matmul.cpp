// Prim family `matmul`: batched matrix product with transpose flags.
// Shape contract: a: (..., M, K) or with ta (..., K, M); b: (..., K, N) or with tb (..., N, K);
// batch dims broadcast (numpy) -> out: (batch..., M, N). Params ints = {ta, tb}. a and b share
// one dtype: f32 and f64 give a product of that dtype, bf16 an f32 product (f32 accumulation).
// Reference: one GEMM per batch entry (oneDNN's for f32 where kiln was built with it, Eigen's
// otherwise; the op's tuned KernelChoice may pick Eigen's, or oneDNN's matmul primitive for the
// whole op); a batched `a` against a 2-D `b` is one GEMM over the flattened rows. bf16
// operands: exact f32 copies and the f32 GEMM, or where the plan's Target chooses
// CpuBf16Products::onednn, oneDNN's bf16 matmul primitive (made on the op's first run, kept by
// the plan). VJP: dA = g op(B)^T, dB = op(A)^T g (with the flags folded in); a gradient for a
// broadcast batch dim is summed by the reverse sweep.
#if KILN_HAVE_DNNL
#include <dnnl.h>
#endif

#include <algorithm>
#include <type_traits>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/cpu_gemm.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/onednn_matmul.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

// bf16 operands give an f32 product: the sums are accumulated in f32, as the tensor cores do.
DType product_dtype(DType operands) { return operands == DType::bf16 ? DType::f32 : operands; }

Shape batch_of(const Shape& s) { return Shape(std::vector<int64_t>(s.dims().begin(), s.dims().end() - 2)); }

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 2) ctx.fail("takes two inputs");
  for (size_t i = 0; i < 2; ++i)
    if (in[i].dtype != DType::f32 && in[i].dtype != DType::f64 && in[i].dtype != DType::bf16)
      ctx.fail(std::string(i == 0 ? "a" : "b") + " must be f32, f64 or bf16, received " + dtype_name(in[i].dtype) +
               in[i].shape.str());
  if (in[0].dtype != in[1].dtype)
    ctx.fail(std::string("a and b must share one dtype (no implicit promotion), received ") + dtype_name(in[0].dtype) +
             " and " + dtype_name(in[1].dtype));
  const Shape &a = in[0].shape, &b = in[1].shape;
  if (a.rank() < 2 || b.rank() < 2) ctx.fail("needs inputs of rank >= 2, received a " + a.str() + " and b " + b.str());
  if (p.ints.size() != 2) ctx.fail("params must be {transpose_a, transpose_b}");
  bool ta = p.ints[0] != 0, tb = p.ints[1] != 0;
  int64_t m = ta ? a[a.rank() - 1] : a[a.rank() - 2];
  int64_t ka = ta ? a[a.rank() - 2] : a[a.rank() - 1];
  int64_t kb = tb ? b[b.rank() - 1] : b[b.rank() - 2];
  int64_t n = tb ? b[b.rank() - 2] : b[b.rank() - 1];
  if (ka != kb)
    ctx.fail("inner dimensions differ: a " + a.str() + (ta ? " (transposed)" : "") + " has K=" + std::to_string(ka) +
             ", b " + b.str() + (tb ? " (transposed)" : "") + " has K=" + std::to_string(kb));
  Shape batch;
  try {
    batch = broadcast_shapes(batch_of(a), batch_of(b), "matmul");
  } catch (const Error&) {
    ctx.fail("batch dims do not broadcast: a " + a.str() + ", b " + b.str());
  }
  std::vector<int64_t> out = batch.dims();
  out.push_back(m);
  out.push_back(n);
  return {{Shape(out), product_dtype(in[0].dtype)}};
}

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// C = op(A) op(B) with A stored as [ra, ca] and B as [rb, cb], all row-major. `eigen`: Eigen's
// GEMM even where oneDNN's sgemm is built in.
template <class T>
void gemm(const T* a, int64_t ra, int64_t ca, bool ta, const T* b, int64_t rb, int64_t cb, bool tb, T* c,
          bool eigen) {
#if KILN_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) {
    if (!eigen) {
      // oneDNN's row-major sgemm, threaded on the OpenMP pool (one thread inside a parallel region).
      const int64_t m = ta ? ca : ra, n = tb ? rb : cb, k = ta ? ra : ca;
      if (m == 0 || n == 0) return;
      if (k == 0) {  // an empty sum (and leading dimensions oneDNN would refuse)
        std::fill(c, c + m * n, 0.0f);
        return;
      }
      const dnnl_status_t status =
          dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, ca, b, cb, 0.0f, c, n);
      if (status != dnnl_success)
        throw Error("op 'matmul': oneDNN sgemm failed (status " + std::to_string(static_cast<int>(status)) +
                    ") for " + std::to_string(m) + "x" + std::to_string(k) + " . " + std::to_string(k) + "x" +
                    std::to_string(n));
      return;
    }
  }
#else
  (void)eigen;
#endif
  Eigen::Map<const RowMat<T>> A(a, ra, ca), B(b, rb, cb);
  int64_t m = ta ? ca : ra, n = tb ? rb : cb;
  Eigen::Map<RowMat<T>> C(c, m, n);
  if (!ta && !tb)
    C.noalias() = A * B;
  else if (ta && !tb)
    C.noalias() = A.transpose() * B;
  else if (!ta && tb)
    C.noalias() = A * B.transpose();
  else
    C.noalias() = A.transpose() * B.transpose();
}

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  // bf16 operands: exact f32 copies, then the f32 product (every product of two bf16 values is
  // exact in f32, so only the f32 accumulation rounds, as on the tensor cores).
  HostTensor a = *in[0], b = *in[1];
  bool ta = op.params.ints[0] != 0, tb = op.params.ints[1] != 0;
  const KernelChoice::Gemm library = bufs.choice().gemm;
  if ((a.dtype() == DType::bf16 && bufs.target().cpu_bf16 == CpuBf16Products::onednn) ||
      (a.dtype() == DType::f32 && library == KernelChoice::Gemm::onednn)) {
    HostTensor out = bufs.output(0);
    if (a.numel() == 0 || b.numel() == 0) {  // an empty sum (K = 0) or an empty product
      if (out.numel() > 0) std::fill(out.data<float>(), out.data<float>() + out.numel(), 0.0f);
      return {out};
    }
    const OneDnnMatmul& product = bufs.compiled<OneDnnMatmul>(
        [&] { return OneDnnMatmul(a.dtype(), a.shape(), ta, b.shape(), tb, out.shape()); });
    product.run(a.raw(), b.raw(), out.data<float>());
    return {out};
  }
  if (a.dtype() == DType::bf16) {
    HostTensor a32 = bufs.scratch(DType::f32, a.shape()), b32 = bufs.scratch(DType::f32, b.shape());
    ref::bf16_to_f32_into(a, a32);
    ref::bf16_to_f32_into(b, b32);
    a = a32;
    b = b32;
  }
  HostTensor out = bufs.output(0);
  const Shape &as = a.shape(), &bs = b.shape(), &os = out.shape();
  int64_t ra = as[as.rank() - 2], ca = as[as.rank() - 1], rb = bs[bs.rank() - 2], cb = bs[bs.rank() - 1];
  int64_t m = os[os.rank() - 2], n = os[os.rank() - 1];
  const bool eigen = library == KernelChoice::Gemm::eigen;
  ref::dispatch_float(a.dtype(), "matmul", [&](auto t) {
    using T = decltype(t);
    Shape batch = batch_of(os);
    if (bs.rank() == 2 && !ta) {
      // Rows of every batch entry of a are one tall matrix against the shared b.
      gemm<T>(a.data<T>(), batch.numel() * ra, ca, false, b.data<T>(), rb, cb, tb, out.data<T>(), eigen);
      return;
    }
    std::vector<int64_t> sa = ref::broadcast_strides(batch_of(as), batch),
                         sb = ref::broadcast_strides(batch_of(bs), batch);
    const int64_t entries = batch.numel();
    if (entries == 1) {
      // Outside any parallel region, so that Eigen threads the GEMM itself (inside even a
      // one-thread team it runs 7x slower).
      gemm<T>(a.data<T>(), ra, ca, ta, b.data<T>(), rb, cb, tb, out.data<T>(), eigen);
      return;
    }
    // Many small GEMMs (attention heads): threads take whole batch entries, each GEMM runs on
    // one thread (Eigen does not nest inside a parallel region).
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < entries; ++e) {
      int64_t oa = 0, ob = 0, rest = e;
      for (int d = batch.rank() - 1; d >= 0; --d) {
        int64_t i = rest % batch[d];
        rest /= batch[d];
        oa += i * sa[static_cast<size_t>(d)];
        ob += i * sb[static_cast<size_t>(d)];
      }
      gemm<T>(a.data<T>() + oa * ra * ca, ra, ca, ta, b.data<T>() + ob * rb * cb, rb, cb, tb,
              out.data<T>() + e * m * n, eigen);
    }
  });
  return {out};
}

std::vector<ValueId> vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  ValueId A = op.inputs[0], B = op.inputs[1], G = g[0];
  // bf16 operands: the backward products take g in bf16 too (as under PyTorch's autocast) and
  // give f32 gradients, the gradient dtype of a bf16 value.
  if (b.info(A).dtype == DType::bf16) G = b.cast(G, DType::bf16);
  bool ta = op.params.ints[0] != 0, tb = op.params.ints[1] != 0;
  ValueId da = ta ? b.matmul(B, G, tb, true) : b.matmul(G, B, false, !tb);
  ValueId db;
  const Shape& as = b.info(A).shape;
  if (b.info(B).shape.rank() == 2 && as.rank() > 2 && !ta) {
    // b is shared by every batch entry: one GEMM over the flattened rows gives the summed dB.
    const Shape& gs = b.info(G).shape;
    int64_t rows = batch_of(as).numel();
    ValueId a2 = b.reshape(A, Shape{rows * as[as.rank() - 2], as[as.rank() - 1]});
    ValueId g2 = b.reshape(G, Shape{rows * gs[gs.rank() - 2], gs[gs.rank() - 1]});
    db = tb ? b.matmul(g2, a2, true, false) : b.matmul(a2, g2, true, false);
  } else {
    db = tb ? b.matmul(G, A, true, ta) : b.matmul(A, G, !ta, false);
  }
  return {da, db};
}

}  // namespace

const char* cpu_gemm_library() {
#if KILN_HAVE_DNNL
  return "oneDNN";
#else
  return "Eigen";
#endif
}

MatmulParams MatmulParams::of(const Op& op) {
  require_view_of(op, {PrimId::matmul}, "MatmulParams");
  return {op.params.ints.at(0) != 0, op.params.ints.at(1) != 0};
}

Params MatmulParams::to_params() const {
  Params p;
  p.ints = {transpose_a ? 1 : 0, transpose_b ? 1 : 0};
  return p;
}

void register_matmul(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::matmul;
  d.shape = shape_rule;
  d.eval = eval;
  d.vjp = vjp;
  d.describe = [](const Params& p) { return "ta=" + std::to_string(p.ints[0]) + " tb=" + std::to_string(p.ints[1]); };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
