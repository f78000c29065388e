// Prim family `where`: out = cond != 0 ? a : b, broadcasting all three (masking).
// Shape contract: cond any dtype (i32 masks, float masks), a and b one float dtype ->
// out: broadcast(cond, a, b) shape, a's dtype. It is a Prim of its own (not a pointwise
// select) because cond may have another dtype than a and b.
// VJP: a gets where(cond, g, 0), b gets where(cond, 0, g); cond has no gradient.
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
  if (in.size() != 3) ctx.fail("takes (cond, a, b)");
  ctx.require_float(in[1], "a");
  ctx.require_float(in[2], "b");
  if (in[1].dtype != in[2].dtype)
    ctx.fail(std::string("a and b must share one dtype, received ") + dtype_name(in[1].dtype) + " and " +
             dtype_name(in[2].dtype));
  Shape out;
  try {
    out = broadcast_shapes(broadcast_shapes(in[0].shape, in[1].shape, "where"), in[2].shape, "where");
  } catch (const Error&) {
    ctx.fail("shapes do not broadcast: cond " + in[0].shape.str() + ", a " + in[1].shape.str() + ", b " +
             in[2].shape.str());
  }
  return {{out, in[1].dtype}};
}

// Blocks of the output, each input read in place when it has the output's element count and
// gathered for the block when broadcast.
template <class T>
const T* block_of(const HostTensor& x, const Shape& s, int64_t start, int64_t len, std::vector<T>& scratch) {
  if (x.numel() == s.numel()) return x.data<T>() + start;
  scratch.resize(static_cast<size_t>(len));
  ref::broadcast_range<T>(x.data<T>(), ref::broadcast_strides(x.shape(), s), s, start, len, scratch.data());
  return scratch.data();
}

std::vector<HostTensor> eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const Shape& s = bufs.info(0).shape;
  HostTensor out = bufs.output(0);
  constexpr int64_t kBlock = 4096;
  const int64_t n = s.numel();
  ref::dispatch_float(out.dtype(), "where", [&](auto t) {
    using T = decltype(t);
    ref::dispatch_any(in[0]->dtype(), "where", [&](auto c) {
      using C = decltype(c);
#pragma omp parallel if (n >= 4 * kBlock)
      {
        std::vector<C> sc;
        std::vector<T> sa, sb;
#pragma omp for schedule(static)
        for (int64_t start = 0; start < n; start += kBlock) {
          int64_t len = std::min(kBlock, n - start);
          const C* cond = block_of<C>(*in[0], s, start, len, sc);
          const T* a = block_of<T>(*in[1], s, start, len, sa);
          const T* b = block_of<T>(*in[2], s, start, len, sb);
          T* o = out.data<T>() + start;
          for (int64_t i = 0; i < len; ++i) o[i] = cond[i] != C(0) ? a[i] : b[i];
        }
      }
    });
  });
  return {out};
}

std::vector<ValueId> vjp(Builder& b, const Op& op, const std::vector<ValueId>& g) {
  ValueId zero = b.fill(Shape{}, b.info(g[0]).dtype, 0.0);
  ValueId cond = op.inputs[0];
  return {kNoValue, b.where(cond, g[0], zero), b.where(cond, zero, g[0])};
}

}  // namespace

void register_where(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::where;
  d.shape = shape_rule;
  d.eval = eval;
  d.vjp = vjp;
  d.nondiff_inputs = {0};
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
