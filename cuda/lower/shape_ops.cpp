// Lowering of the shape ops (circuit/prims/shape_ops.cpp): reshape shares its input's buffer (no
// kernel); permute and broadcast are one copy through strided addressing.
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

namespace {

LoweredOp lower_permute(const Circuit& c, const Op& op, const Target& target) {
  const std::vector<int64_t> xs = c.info(op.inputs[0]).shape.strides();
  std::vector<int64_t> strides;
  for (int64_t a : PermuteParams::of(op).perm) strides.push_back(xs[static_cast<size_t>(a)]);
  return strided_copy(c, op, target, strides);
}

LoweredOp lower_broadcast(const Circuit& c, const Op& op, const Target& target) {
  return strided_copy(c, op, target, broadcast_strides(c.info(op.inputs[0]).shape, c.info(op.outputs[0]).shape));
}

}  // namespace

void register_shape_ops_lowering(LoweringTable& t) {
  t.add_alias(PrimId::reshape, 0, "alias (no kernel)");
  t.add(PrimId::permute, lower_permute, "copy with permuted strides");
  t.add(PrimId::broadcast, lower_broadcast, "copy with zero strides");
}

}  // namespace kiln::cuda
