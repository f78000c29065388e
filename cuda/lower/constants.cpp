// Lowering of fill and iota (circuit/prims/constants.cpp): an elementwise constant, or an index
// expression of each element's coordinates (in s64 where the domain needs it).
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::imm_f32;

namespace {

LoweredOp lower_fill(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& out = c.info(op.outputs[0]);
  const DType dt = out.dtype;
  const double v = FillParams::of(op).value;
  auto value = [dt, v](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>&, const std::vector<Reg>&) {
    return dt == DType::f32 ? b.mov(Type::f32, imm_f32(static_cast<float>(v)))
                            : b.mov(Type::s32, kir::imm_s32(static_cast<int32_t>(v)));
  };
  return single_launch(
      elementwise_launch(target, "kiln_fill", out.shape, {kOut0}, {}, access_of(0, out, out.shape.strides()), value),
      "fill");
}

LoweredOp lower_iota(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& out = c.info(op.outputs[0]);
  const DType dt = out.dtype;
  const IndexExp index = op.params.index;
  auto value = [dt, index](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>& coords,
                           const std::vector<Reg>&) { return b.cvt(kir_type(dt), emit_index_exp(b, index, coords)); };
  return single_launch(elementwise_launch(target, "kiln_iota", out.shape, {kOut0}, {},
                                          access_of(0, out, out.shape.strides()), value, true),
                       "iota " + index.str());
}

}  // namespace

void register_constants_lowering(LoweringTable& t) {
  t.add(PrimId::fill, lower_fill, "elementwise constant");
  t.add(PrimId::iota, lower_iota, "elementwise index expression (s64)");
}

}  // namespace kiln::cuda
