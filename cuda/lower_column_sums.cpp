// Lowering of column_sums (circuit/prims/column_sums.cpp): one thread per column walks the rows
// in order, evaluates every body at each element (each input read at its broadcast address)
// and keeps one f32 accumulator per body; no atomics, so the sums do not depend on scheduling.
// Consecutive threads read consecutive columns, so the loads coalesce. f32 accumulation error
// bound rows * 2^-24 * sum |x| per column, as reduce.
#include "cuda/lower_elementwise.hpp"

namespace kiln::cuda {

using kir::imm_f32;
using kir::Space;

LoweredOp lower_column_sums(const Circuit& c, const Op& op) {
  const Shape domain(op.params.ints);
  const std::vector<int64_t> lead(domain.dims().begin(), domain.dims().end() - 1);
  const int64_t cols = domain[domain.rank() - 1], rows = Shape(lead).numel();
  int64_t largest = domain.numel();
  for (ValueId v : op.inputs) largest = std::max(largest, c.info(v).shape.numel());
  const Type it = index_type(largest);

  KernelBuilder b("kiln_column_sums");
  std::vector<ArgRef> args;
  std::vector<Reg> in_ptr;
  std::vector<std::vector<int64_t>> strides;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    in_ptr.push_back(b.param("in" + std::to_string(k), Type::u64));
    args.push_back({ArgRef::Kind::Input, static_cast<int>(k)});
    strides.push_back(broadcast_strides(c.info(op.inputs[k]).shape, domain));
  }
  std::vector<Reg> out_ptr;
  for (size_t r = 0; r < op.outputs.size(); ++r) {
    out_ptr.push_back(b.param("out" + std::to_string(r), Type::u64));
    args.push_back({ArgRef::Kind::Output, static_cast<int>(r)});
  }
  grid_stride_loop(b, it, cols, [&](Reg col) {
    std::vector<Reg> acc;
    for (size_t r = 0; r < op.params.bodies.size(); ++r) acc.push_back(b.mov(Type::f32, imm_f32(0.0f)));
    b.for_(imm_index(it, 0), imm_index(it, rows), imm_index(it, 1), [&](Reg row) {
      std::vector<Reg> coords = coordinates(b, row, lead);
      coords.push_back(col);
      std::vector<Reg> vals;
      for (size_t k = 0; k < op.inputs.size(); ++k)
        vals.push_back(load_as_f32(b, c.info(op.inputs[k]).dtype, in_ptr[k], linear_offset(b, coords, strides[k], 0)));
      for (size_t r = 0; r < acc.size(); ++r)
        b.assign(kir::Opc::Add, acc[r], {acc[r], emit_scalar_exp(b, op.params.bodies[r], vals)});
    });
    for (size_t r = 0; r < acc.size(); ++r) b.st(Space::global, Type::f32, b.address(out_ptr[r], col, 4), acc[r]);
  });
  LoweredOp lo;
  lo.launches.push_back(
      finish_launch(b, "kiln_column_sums", elementwise_grid(cols), {kElementwiseThreads, 1, 1}, std::move(args)));
  lo.summary = "column_sums: " + std::to_string(op.params.bodies.size()) + " sums over " + std::to_string(rows) +
               " rows, a thread per column, " + launch_text(lo.launches.back());
  return lo;
}

}  // namespace kiln::cuda
