// Lowering of pointwise (circuit/prims/pointwise.cpp): its body in f32, broadcasting as addressing.
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

namespace {

LoweredOp lower_pointwise(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& out = c.info(op.outputs[0]);
  std::vector<ArgRef> args;
  std::vector<Access> loads;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    const ValueInfo& in = c.info(op.inputs[k]);
    args.push_back({ArgRef::Kind::Input, static_cast<int>(k)});
    loads.push_back(access_of(static_cast<int>(k), in, broadcast_strides(in.shape, out.shape)));
  }
  args.push_back(kOut0);
  Access store = access_of(static_cast<int>(args.size()) - 1, out, out.shape.strides());
  const ScalarExp body = op.params.body;
  auto value = [body](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    return emit_scalar_exp(b, body, in);
  };
  return single_launch(elementwise_launch(target, "kiln_pointwise", out.shape, args, loads, store, value),
                       "pointwise " + body.str());
}

}  // namespace

void register_pointwise_lowering(LoweringTable& t) {
  t.add(PrimId::pointwise, lower_pointwise, "elementwise kernel, body in f32, broadcasting as addressing");
}

}  // namespace kiln::cuda
