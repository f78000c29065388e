// Lowering of the row gathers.
//   gather_rows       table: (V, D), idx: i32 S -> out: S + (D); one thread per output element
//   scatter_add_rows  idx: i32 S, src: S + (D) -> out: (rows, D); out is zeroed first, then one
//                     thread per src element adds it with an f32 atomic (order-dependent
//                     rounding: a deterministic mode without atomics is the fusion issue's)
// An index outside [0, V) (or [0, rows)) is counted in the status words and its element
// skipped; the program turns a nonzero count into an error naming the op, as the reference.
#include "cuda/lower_elementwise.hpp"

namespace kiln::cuda {

using kir::Cmp;
using kir::Space;

LoweredOp lower_gather(const Circuit& c, const Op& op) {
  const bool gather = op.prim->name == "gather_rows";
  const ValueInfo& data = c.info(op.inputs[gather ? 0 : 1]);  // table or src
  const ValueInfo& out = c.info(op.outputs[0]);
  const int64_t D = out.shape[out.shape.rank() - 1];
  const int64_t rows = gather ? data.shape[0] : out.shape[0];
  const int64_t n = gather ? out.shape.numel() : data.shape.numel();  // elements moved
  const Type it = index_type(std::max({n, data.shape.numel(), out.shape.numel()}));
  const std::string prefix = gather ? "kiln_gather_rows" : "kiln_scatter_add_rows";
  KernelBuilder b(prefix);
  Reg p_data = b.param("data", Type::u64), p_idx = b.param("idx", Type::u64), p_out = b.param("out", Type::u64);
  Reg status = b.param("status", Type::u64);
  grid_stride_loop(b, it, n, [&](Reg i) {
    Reg s = b.div(it, i, imm_index(it, D)), d = b.rem(it, i, imm_index(it, D));
    Reg row = b.ld(Space::global, Type::s32, b.address(p_idx, s, 4));
    Reg bad = b.or_(Type::pred, b.setp(Cmp::lt, row, kir::imm_s32(0)),
                    b.setp(Cmp::ge, row, kir::imm_s32(static_cast<int32_t>(rows))));
    b.if_(
        bad,
        [&] {
          // Report each bad index once (at d == 0).
          b.if_(b.setp(Cmp::eq, d, imm_index(it, 0)), [&] { record_index_error(b, status, row); });
        },
        [&] {
          Reg row_it = it == Type::u32 ? b.cvt(Type::u32, row) : b.cvt(Type::u64, row);
          Reg at = b.mad(it, row_it, imm_index(it, D), d);
          if (gather) {
            b.st(Space::global, Type::f32, b.address(p_out, i, 4),
                 b.ld(Space::global, Type::f32, b.address(p_data, at, 4)));
          } else {
            b.atom_add(Space::global, Type::f32, b.address(p_out, at, 4),
                       b.ld(Space::global, Type::f32, b.address(p_data, i, 4)));
          }
        });
  });
  LoweredOp r;
  const ArgRef data_arg{ArgRef::Kind::Input, gather ? 0 : 1}, idx_arg{ArgRef::Kind::Input, gather ? 1 : 0};
  r.launches.push_back(finish_launch(b, prefix, elementwise_grid(n), {kElementwiseThreads, 1, 1},
                                     {data_arg, idx_arg, {ArgRef::Kind::Output, 0}, {ArgRef::Kind::Status, 0}}));
  r.zero_outputs = !gather;
  r.summary = std::string(gather ? "gather_rows: one thread per output element"
                                 : "scatter_add_rows: zero, then f32 atomic adds per source element") +
              ", " + launch_text(r.launches.back());
  return r;
}

}  // namespace kiln::cuda
