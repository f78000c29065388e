// Lowering of cast and stop_gradient (circuit/prims/cast.cpp): an elementwise cvt; stop_gradient
// shares its input's buffer (no kernel).
#include <string>

#include "cuda/lower/elementwise.hpp"
#include "cuda/lower/families.hpp"

namespace kiln::cuda {

namespace {

LoweredOp lower_cast(const Circuit& c, const Op& op) {
  const ValueInfo& x = c.info(op.inputs[0]);
  const ValueInfo& out = c.info(op.outputs[0]);
  const DType to = out.dtype;
  // Between i32 and bf16 through f32, as the host converts (and sm_80 has no cvt between them).
  auto value = [to](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    Reg x = in[0];
    const Type t = kir_type(to);
    if (x.type == t) return x;
    if ((x.type == Type::s32 && t == Type::bf16) || (x.type == Type::bf16 && t == Type::s32)) x = b.cvt(Type::f32, x);
    return b.cvt(t, x);
  };
  return single_launch(elementwise_launch("kiln_cast", out.shape, {kIn0, kOut0}, {access_of(0, x, x.shape.strides())},
                                          access_of(1, out, out.shape.strides()), value),
                       std::string("cast ") + dtype_name(x.dtype) + " -> " + dtype_name(to));
}

}  // namespace

void register_cast_lowering(LoweringTable& t) {
  t.add(PrimId::cast, lower_cast, "elementwise cvt");
  t.add_alias(PrimId::stop_gradient, 0, "alias (no kernel)");
}

}  // namespace kiln::cuda
