// Prim family `all_reduce`: the mean of a value over the ranks of a data-parallel run
// (circuit/comm/communicator.hpp), for the gradients between backward and the optimizer.
//   all_reduce  x -> the same shape and dtype: x averaged element-wise over world()'s ranks
// A bucket of gradients flattened side by side is one op, one collective. Every rank runs the
// same plan, so they call it in the same order. No VJP (it is applied to gradients); no pass
// fuses it (it is none of the Prims they absorb), and data dependence keeps it between the
// backward that feeds it and the update that reads it. With one rank it copies x.
#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
  if (in.size() != 1) ctx.fail("takes one input (a bucket of values)");
  if (in[0].dtype != DType::f32 && in[0].dtype != DType::f64)
    ctx.fail(std::string("averages f32 or f64 values, received ") + dtype_name(in[0].dtype));
  return {in[0]};
}

std::vector<HostTensor> eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  HostTensor out = bufs.output(0);
  Communicator& comm = world();
  ref::dispatch_float(out.dtype(), "all_reduce", [&](auto t) {
    using T = decltype(t);
    const T* x = in[0]->data<T>();
    T* y = out.data<T>();
    const int64_t n = out.numel();
    std::copy(x, x + n, y);
    if (comm.size() == 1) return;
    comm.all_reduce_sum(y, n);
    const T inv = T(1) / static_cast<T>(comm.size());
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  });
  return {out};
}

}  // namespace

void register_all_reduce(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::all_reduce;
  d.shape = shape_rule;
  d.eval = eval;
  d.describe = [](const Params&) { return std::string("mean over the ranks"); };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
