// Prim family `all_reduce`: the collectives of a data-parallel run (circuit/comm/communicator.hpp),
// for the gradients between backward and the optimizer and, sharded (ZeRO-1), the parameters after it.
//   all_reduce {}       x -> the same shape and dtype: x averaged element-wise over world()'s ranks
//   all_reduce {start}  x -> x, its sum over the ranks begun (in flight: only the finish reads it)
//   all_reduce {finish} s -> the mean, once the sum begun on s is done
//   reduce_scatter {N}  x [N S] -> [S]: this rank's chunk (rank r: [r S, (r + 1) S)) of x's mean over the N ranks
//   all_gather {N}      x [S] -> [N S]: every rank's x, rank r's at [r S, (r + 1) S)
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

bool is_collective(const Op& op) {
  return op.is(PrimId::all_reduce) || op.is(PrimId::reduce_scatter) || op.is(PrimId::all_gather);
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

// reduce_scatter and all_gather: params {N}, the ranks the plan was made for.
int64_t planned_ranks(const Params& p) { return p.ints.size() == 1 ? p.ints[0] : 0; }

void check_ranks(const char* prim, const Params& p) {
  if (planned_ranks(p) != world().size())
    throw Error(std::string(prim) + ": planned for " + std::to_string(planned_ranks(p)) + " ranks, the run has " +
                std::to_string(world().size()));
}

std::vector<ValueInfo> shard_shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p,
                                        bool scatter) {
  if (in.size() != 1 || in[0].shape.rank() != 1) ctx.fail("takes one vector (parameters or gradients flattened)");
  if (in[0].dtype != DType::f32 && in[0].dtype != DType::f64)
    ctx.fail(std::string("moves f32 or f64 values, received ") + dtype_name(in[0].dtype));
  const int64_t ranks = planned_ranks(p), n = in[0].shape[0];
  if (ranks < 1) ctx.fail("params: expected {ranks}, a count of at least 1");
  if (scatter && n % ranks != 0)
    ctx.fail("a vector of " + std::to_string(n) + " values does not split into " + std::to_string(ranks) +
             " equal chunks (pad it)");
  return {{Shape{scatter ? n / ranks : n * ranks}, in[0].dtype}};
}

std::vector<HostTensor> eval_reduce_scatter(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  check_ranks("reduce_scatter", op.params);
  HostTensor out = bufs.output(0);
  Communicator& comm = world();
  ref::dispatch_float(out.dtype(), "reduce_scatter", [&](auto t) {
    using T = decltype(t);
    const int64_t n = in[0]->numel(), s = out.numel();
    T* y = out.data<T>();
    const T* own = in[0]->data<T>() + comm.rank() * s;
    if (comm.size() == 1) {
      std::copy(own, own + s, y);
      return;
    }
    HostTensor work = bufs.scratch(out.dtype(), in[0]->shape());  // the communicator sums in place
    T* w = work.data<T>();
    std::copy(in[0]->data<T>(), in[0]->data<T>() + n, w);
    comm.reduce_scatter_sum(w, n);
    const T inv = T(1) / static_cast<T>(comm.size());
    for (int64_t i = 0; i < s; ++i) y[i] = w[comm.rank() * s + i] * inv;
  });
  return {out};
}

std::vector<HostTensor> eval_all_gather(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  check_ranks("all_gather", op.params);
  HostTensor out = bufs.output(0);
  Communicator& comm = world();
  ref::dispatch_float(out.dtype(), "all_gather", [&](auto t) {
    using T = decltype(t);
    const int64_t s = in[0]->numel();
    T* y = out.data<T>();
    std::copy(in[0]->data<T>(), in[0]->data<T>() + s, y + comm.rank() * s);
    if (comm.size() > 1) comm.all_gather(y, out.numel());
  });
  return {out};
}

}  // namespace

void register_all_reduce(PrimRegistry& r) {
  for (const bool scatter : {true, false}) {
    PrimDef d;
    d.id = scatter ? PrimId::reduce_scatter : PrimId::all_gather;
    d.shape = [scatter](const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
      return shard_shape_rule(ctx, in, p, scatter);
    };
    d.eval = scatter ? eval_reduce_scatter : eval_all_gather;
    d.describe = [scatter](const Params& p) {
      return std::string(scatter ? "this rank's chunk of the mean" : "every rank's chunk") + " over " +
             std::to_string(planned_ranks(p)) + " ranks";
    };
    r.add(std::move(d), __FILE__);
  }
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
