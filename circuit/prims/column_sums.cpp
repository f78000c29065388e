// Prim family `column_sums`: several sums along every axis but the last, of pointwise bodies
// over one domain, in one op. The column fusion (circuit/passes/fuse_columns.cpp) builds it from the
// sums over the token axes that a layernorm's parameter gradients are (gamma: sum of dy * xhat,
// beta: sum of dy), so that both come out of one pass over dy; it has no VJP rule.
// Params: ints = the domain's dims (rank >= 2), bodies = one per output, over in0.. (each input
// broadcast, numpy rules, to the domain). Output r: [1, last dim], the sum over the leading
// axes of body r. Reference: each body evaluated over the domain, then Eigen column sums.
#include <spdlog/fmt/fmt.h>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/prims/body_eval.hpp>
#include <kiln/circuit/prims/eigen_util.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  const Shape domain(p.ints);
  if (domain.rank() < 2) ctx.fail("needs a domain of rank >= 2 (rows..., columns), received " + domain.str());
  ctx.require_dims(p.ints, "domain");
  if (p.bodies.empty()) ctx.fail("needs at least one body");
  if (p.dtype != DType::f32 && p.dtype != DType::f64) ctx.fail("result dtype must be f32 or f64");
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].dtype != p.dtype)
      ctx.fail(fmt::format("input {} is {}; every input must be {}", i, dtype_name(in[i].dtype), dtype_name(p.dtype)));
    bool ok = true;
    try {
      ok = broadcast_shapes(in[i].shape, domain, "column_sums") == domain;
    } catch (const Error&) {
      ok = false;
    }
    if (!ok)
      ctx.fail(fmt::format("input {} {} does not broadcast to the domain {}", i, in[i].shape.str(), domain.str()));
  }
  for (const ScalarExp& e : p.bodies)
    if (e.num_inputs() > static_cast<int>(in.size()))
      ctx.fail(fmt::format("body {} reads past the {} inputs", e.str(), in.size()));
  return std::vector<ValueInfo>(p.bodies.size(), ValueInfo{Shape{1, domain[domain.rank() - 1]}, p.dtype});
}

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const Shape domain(op.params.ints);
  const int64_t cols = domain[domain.rank() - 1], rows = domain.numel() / std::max<int64_t>(cols, 1);
  std::vector<HostTensor> outs;
  ref::dispatch_float(op.params.dtype, "column_sums", [&](auto t) {
    using T = decltype(t);
    using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    HostTensor value = bufs.scratch(op.params.dtype, domain);
    for (size_t r = 0; r < op.params.bodies.size(); ++r) {
      ref::run_all(ref::BodyRunner<T>(op.params.bodies[r], in, domain), value.data<T>(), domain.numel());
      HostTensor out = bufs.output(r);
      Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(out.data<T>(), cols) =
          Eigen::Map<const RowMat>(value.data<T>(), rows, cols).colwise().sum();
      outs.push_back(std::move(out));
    }
  });
  return outs;
}

std::string describe(const Params& p) {
  std::string s = "domain " + Shape(p.ints).str();
  for (size_t r = 0; r < p.bodies.size(); ++r) s += fmt::format(" out{}=sum{{{}}}", r, p.bodies[r].str());
  return s;
}

}  // namespace

ColumnSumsParams ColumnSumsParams::of(const Op& op) {
  require_view_of(op, {PrimId::column_sums}, "ColumnSumsParams");
  return {Shape(op.params.ints), op.params.bodies, op.params.dtype};
}

Params ColumnSumsParams::to_params() const {
  Params p;
  p.ints = domain.dims();
  p.bodies = bodies;
  p.dtype = dtype;
  return p;
}

void register_column_sums(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::column_sums;
  d.shape = shape_rule;
  d.eval = eval;
  d.describe = describe;
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
