// Prim family `all_reduce`: the mean of a value over the ranks of a data-parallel run
// (circuit/comm/communicator.hpp), for the gradients between backward and the optimizer.
//   all_reduce {}       x -> the same shape and dtype: x averaged element-wise over world()'s ranks
//   all_reduce {start}  x -> x, its sum over the ranks begun (in flight: only the finish reads it)
//   all_reduce {finish} s -> the mean, once the sum begun on s is done
// A bucket of gradients flattened side by side is one op, one collective. Every rank runs the
// same plan, so they start them in the same order. No VJP (it is applied to gradients); no pass
// fuses it (it is none of the Prims they absorb), and data dependence keeps it between the
// backward that feeds it and the update that reads it. With one rank it copies x. CPU plans split
// it in two (overlap_collectives), GPU plans keep it whole (the device collective's graph node).
#include <spdlog/fmt/fmt.h>

#include <algorithm>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

AllReduceParams AllReduceParams::of(const Op& op) {
  require_view_of(op, {PrimId::all_reduce}, "AllReduceParams");
  if (op.params.ints.empty()) return {};
  const int64_t s = op.params.ints[0];
  if (s < 0 || s > 2) throw Error("all_reduce: stage " + std::to_string(s) + " is none of whole, start, finish");
  return {static_cast<AllReduceStage>(s)};
}

Params AllReduceParams::to_params() const {
  Params p;
  if (stage != AllReduceStage::whole) p.ints = {static_cast<int64_t>(stage)};
  return p;
}

namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  if (in.size() != 1) ctx.fail("takes one input (a bucket of values)");
  if (in[0].dtype != DType::f32 && in[0].dtype != DType::f64)
    ctx.fail(std::string("averages f32 or f64 values, received ") + dtype_name(in[0].dtype));
  if (p.ints.size() > 1 || (p.ints.size() == 1 && (p.ints[0] < 0 || p.ints[0] > 2)))
    ctx.fail("params: expected {} or {stage} (1 start, 2 finish)");
  return {in[0]};
}

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  HostTensor out = bufs.output(0);
  Communicator& comm = world();
  const AllReduceStage stage = AllReduceParams::of(op).stage;
  ref::dispatch_float(out.dtype(), "all_reduce", [&](auto t) {
    using T = decltype(t);
    const T* x = in[0]->data<T>();
    T* y = out.data<T>();
    const int64_t n = out.numel();
    // The finish waits on its input's buffer before reading it.
    if (stage == AllReduceStage::finish && comm.size() > 1) comm.finish_all_reduce(x);
    if (x != y) std::copy(x, x + n, y);  // the executor may store the output over the input
    if (comm.size() == 1) return;
    if (stage == AllReduceStage::start) {
      comm.start_all_reduce_sum(y, n);
      return;
    }
    if (stage == AllReduceStage::whole) comm.all_reduce_sum(y, n);
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
  d.describe = [](const Params& p) {
    return std::string("mean over the ranks") + (p.ints.empty()   ? ""
                                                 : p.ints[0] == 1 ? " (start)"
                                                 : p.ints[0] == 2 ? " (finish)"
                                                                  : "");
  };
  // Element-wise, each element read before it is written; the started sum runs in its output.
  d.may_overwrite = [](const Op&, const std::vector<ValueInfo>&, size_t, size_t) { return true; };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
