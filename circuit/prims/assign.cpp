// Prim family `assign`: the in-place write of a persistent buffer (parameters, gradients,
// optimizer moments). Shape contract: target: T, value: T (same shape and dtype) -> T, the
// buffer's new version. Circuit::verify checks that every read of the old version comes
// before the assign. An assign is a side effect: DCE keeps it. The executor commits the
// write to the buffer only after every op of the run has succeeded (a failed step changes no
// buffer); until then the new version is the value itself, which is what the reference
// returns. It has no VJP rule: differentiating through a buffer update fails loudly.
#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/prims/families.hpp>

namespace kiln {
namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
  if (in.size() != 2) ctx.fail("takes (target, value)");
  if (!(in[0] == in[1]))
    ctx.fail(std::string("value must match the target buffer: expected ") + dtype_name(in[0].dtype) +
             in[0].shape.str() + ", received " + dtype_name(in[1].dtype) + in[1].shape.str());
  return {in[0]};
}

std::vector<HostTensor> eval(const Op&, const std::vector<const HostTensor*>& in, EvalBuffers&) { return {*in[1]}; }

}  // namespace

void register_assign(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::assign;
  d.shape = shape_rule;
  d.eval = eval;
  d.side_effect = true;
  d.output_aliases = 1;  // the new version is the value itself until the run commits it
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
