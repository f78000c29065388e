// Lowering of where (circuit/prims/where.cpp): an elementwise select, operands broadcast.
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;

namespace {

LoweredOp lower_where(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& out = c.info(op.outputs[0]);
  std::vector<Access> loads;
  for (int k = 0; k < 3; ++k) {
    const ValueInfo& in = c.info(op.inputs[static_cast<size_t>(k)]);
    loads.push_back(access_of(k, in, broadcast_strides(in.shape, out.shape)));
  }
  auto value = [](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    Operand zero = in[0].type == Type::f32 ? imm_f32(0.0f) : kir::imm_s32(0);
    return b.selp(Type::f32, in[1], in[2], b.setp(Cmp::ne, in[0], zero));
  };
  return single_launch(elementwise_launch(target, "kiln_where", out.shape, {kIn0, kIn1, kIn2, kOut0}, loads,
                                          access_of(3, out, out.shape.strides()), value),
                       "where");
}

}  // namespace

void register_where_lowering(LoweringTable& t) { t.add(PrimId::where, lower_where, "elementwise select"); }

}  // namespace kiln::cuda
