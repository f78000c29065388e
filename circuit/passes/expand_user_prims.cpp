// expand_user_prims: custom VJPs forwarded; pointwise and row bodies substituted for the GPU.
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/expand_user_prims.hpp>

namespace kiln {

Circuit expand_user_prims(const Circuit& c, std::vector<ValueId>& outputs, const Target& target) {
  bool any = false;
  for (const Op& op : c.ops()) any = any || op.is(PrimId::user);
  if (!any) return c;
  Rebuild r(c);
  for (const Op& op : c.ops()) {
    if (!op.is(PrimId::user)) {
      r.copy(op);
      continue;
    }
    const PrimDef& prim = *op.prim;
    if (prim.forwards_input0) {
      r.map(op.outputs[0], r.at(op.inputs[0]));
      continue;
    }
    if (!target.gpu() || prim.gpu_kernel) {  // the reference, or the Prim's own kernels
      r.copy(op);
      continue;
    }
    if (prim.row_body) {
      std::vector<ValueInfo> in;
      for (ValueId v : op.inputs) in.push_back(c.info(v));
      std::vector<ValueId> emitted;
      try {
        emitted = r.out().add_op(PrimId::fused_rows, prim.row_body(in, op.params), r.at(op.inputs), op.scope);
      } catch (const Error& e) {
        fail(prim.name, op.scope,
             "its row body does not apply (registered at " + prim.registered_at + "): " + e.what());
      }
      r.out().set_phase(r.out().ops().size() - 1, op.phase);
      for (size_t k = 0; k < op.outputs.size(); ++k) {
        const ValueInfo& want = c.info(op.outputs[k]);
        const ValueInfo* got = k < emitted.size() ? &r.out().info(emitted[k]) : nullptr;
        if (!got || !(*got == want) || emitted.size() != op.outputs.size())
          fail(prim.name, op.scope,
               "its row body gives " + std::to_string(emitted.size()) + " outputs" +
                   (got ? ", output " + std::to_string(k) + " " + dtype_name(got->dtype) + got->shape.str() : "") +
                   ", where its shape rule gives " + std::to_string(op.outputs.size()) + ", output " +
                   std::to_string(k) + " " + dtype_name(want.dtype) + want.shape.str() + " (registered at " +
                   prim.registered_at + ")");
        r.map(op.outputs[k], emitted[k]);
      }
      continue;
    }
    if (!prim.pointwise_body)
      fail(prim.name, op.scope,
           "has no GPU lowering (registered at " + prim.registered_at +
               "): it runs on the CPU only; give its UserPrimSpec a pointwise_body, row_body or gpu_kernel, or run "
               "this step on the CPU");
    if (op.outputs.size() != 1)
      fail(prim.name, op.scope,
           "has " + std::to_string(op.outputs.size()) + " outputs, and a pointwise body gives one (registered at " +
               prim.registered_at + ")");
    const ValueInfo& out = c.info(op.outputs[0]);
    Params params;
    std::vector<ValueId> emitted;
    try {
      params.body = prim.pointwise_body(op.params);
      emitted = r.out().add_op(PrimId::pointwise, params, r.at(op.inputs), op.scope);
    } catch (const Error& e) {
      fail(prim.name, op.scope,
           "its pointwise body does not apply (registered at " + prim.registered_at + "): " + e.what());
    }
    r.out().set_phase(r.out().ops().size() - 1, op.phase);
    // The body's op replaces op only if it has op's output: say which piece disagrees.
    const ValueInfo& got = r.out().info(emitted[0]);
    if (!(got == out))
      fail(prim.name, op.scope,
           "its pointwise body " + params.body.str() + " gives " + dtype_name(got.dtype) + got.shape.str() +
               " where its shape rule gives " + dtype_name(out.dtype) + out.shape.str() + " (registered at " +
               prim.registered_at + ")");
    r.map(op.outputs[0], emitted[0]);
  }
  return r.finish(outputs);
}

}  // namespace kiln
