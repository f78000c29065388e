// Lowering of the gather family (circuit/prims/gather.cpp).
//   one_hot           idx: i32 S -> out: S + (depth); one thread per output element
//   gather_rows       table: (V, D), idx: i32 S -> out: S + (D); one thread per output element
//   gather_last       x: S + (V), idx: i32 S -> out: S; one thread per output element
//   scatter_add_rows  idx: i32 S, src: S + (D) -> out: (rows, D); out is zeroed first, then one
//                     thread per src element adds it with an f32 atomic (order-dependent
//                     rounding). Ordered (the deterministic mode): one thread per column adds
//                     the source rows in order, as the reference does, so the bits are the
//                     reference's; only D threads work, each through all S rows.
// An index outside [0, V) (or [0, rows)) is counted in the status words and its element
// skipped; the program turns a nonzero count into an error naming the op, as the reference.
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::Space;

namespace {

LoweredOp lower_ordered_scatter(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& src = c.info(op.inputs[1]);
  const ValueInfo& out = c.info(op.outputs[0]);
  const int64_t D = out.shape[1], rows = out.shape[0], S = c.info(op.inputs[0]).shape.numel();
  const Type it = index_type(target, std::max(src.shape.numel(), out.shape.numel()));
  KernelBuilder b("kiln_scatter_add_rows_ordered");
  Reg p_src = b.param("src", Type::u64), p_idx = b.param("idx", Type::u64), p_out = b.param("out", Type::u64);
  Reg status = b.param("status", Type::u64);
  grid_stride_loop(b, it, D, [&](Reg d) {
    b.for_(imm_index(it, 0), imm_index(it, S), imm_index(it, 1), [&](Reg s) {
      Reg row = b.ld(Space::global, Type::s32, b.address(p_idx, s, 4));
      Reg bad = b.or_(Type::pred, b.setp(Cmp::lt, row, kir::imm_s32(0)),
                      b.setp(Cmp::ge, row, kir::imm_s32(static_cast<int32_t>(rows))));
      b.if_(
          bad, [&] { b.if_(b.setp(Cmp::eq, d, imm_index(it, 0)), [&] { record_index_error(b, status, row); }); },
          [&] {
            Reg row_it = it == Type::u32 ? b.cvt(Type::u32, row) : b.cvt(Type::u64, row);
            Reg at = b.address(p_out, b.mad(it, row_it, imm_index(it, D), d), 4);
            Reg v = b.ld(Space::global, Type::f32, b.address(p_src, b.mad(it, s, imm_index(it, D), d), 4));
            b.st(Space::global, Type::f32, at, b.add(Type::f32, b.ld(Space::global, Type::f32, at), v));
          });
    });
  });
  LoweredOp r;
  r.launches.push_back(finish_launch(
      b, "kiln_scatter_add_rows_ordered", elementwise_grid(D), {kElementwiseThreads, 1, 1},
      {{ArgRef::Kind::Input, 1}, {ArgRef::Kind::Input, 0}, {ArgRef::Kind::Output, 0}, {ArgRef::Kind::Status, 0}}));
  r.zero_outputs = true;
  r.summary = "scatter_add_rows ordered: zero, then a thread per column adds the rows in order, " +
              launch_text(r.launches.back());
  return r;
}

LoweredOp lower_gather_last(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& x = c.info(op.inputs[0]);
  const int64_t V = x.shape[x.shape.rank() - 1], n = c.info(op.outputs[0]).shape.numel();
  const Type it = index_type(target, x.shape.numel());
  KernelBuilder b("kiln_gather_last");
  Reg p_x = b.param("x", Type::u64), p_idx = b.param("idx", Type::u64), p_out = b.param("out", Type::u64);
  Reg status = b.param("status", Type::u64);
  grid_stride_loop(b, it, n, [&](Reg s) {
    Reg col = b.ld(Space::global, Type::s32, b.address(p_idx, s, 4));
    Reg bad = b.or_(Type::pred, b.setp(Cmp::lt, col, kir::imm_s32(0)),
                    b.setp(Cmp::ge, col, kir::imm_s32(static_cast<int32_t>(V))));
    b.if_(
        bad, [&] { record_index_error(b, status, col); },
        [&] {
          Reg col_it = it == Type::u32 ? b.cvt(Type::u32, col) : b.cvt(Type::u64, col);
          Reg at = b.mad(it, s, imm_index(it, V), col_it);
          b.st(Space::global, Type::f32, b.address(p_out, s, 4), b.ld(Space::global, Type::f32, b.address(p_x, at, 4)));
        });
  });
  LoweredOp r;
  r.launches.push_back(finish_launch(
      b, "kiln_gather_last", elementwise_grid(n), {kElementwiseThreads, 1, 1},
      {{ArgRef::Kind::Input, 0}, {ArgRef::Kind::Input, 1}, {ArgRef::Kind::Output, 0}, {ArgRef::Kind::Status, 0}}));
  r.summary = "gather_last: one thread per output element, " + launch_text(r.launches.back());
  return r;
}

LoweredOp lower_gather(const Circuit& c, const Op& op, const Target& target) {
  if (op.is(PrimId::gather_last)) return lower_gather_last(c, op, target);
  const bool gather = op.is(PrimId::gather_rows);
  if (!gather && ScatterAddRowsParams::of(op).ordered) return lower_ordered_scatter(c, op, target);
  const ValueInfo& data = c.info(op.inputs[gather ? 0 : 1]);  // table or src
  const ValueInfo& out = c.info(op.outputs[0]);
  const int64_t D = out.shape[out.shape.rank() - 1];
  const int64_t rows = gather ? data.shape[0] : out.shape[0];
  const int64_t n = gather ? out.shape.numel() : data.shape.numel();  // elements moved
  const Type it = index_type(target, std::max({n, data.shape.numel(), out.shape.numel()}));
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

LoweredOp lower_one_hot(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& idx = c.info(op.inputs[0]);
  const ValueInfo& out = c.info(op.outputs[0]);
  const int64_t depth = OneHotParams::of(op).depth;
  std::vector<int64_t> st = idx.shape.strides();
  st.push_back(0);
  const DType dt = out.dtype;
  // Checks each index once (at depth coordinate 0) and records a bad one in the status words.
  auto value = [dt, depth](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>& coords,
                           const std::vector<Reg>& base) {
    Reg last = coords.back();
    Reg last_s = last.type == Type::u32 ? b.cvt(Type::s32, last) : b.cvt(Type::s32, last);
    Reg bad = b.or_(Type::pred, b.setp(Cmp::lt, in[0], kir::imm_s32(0)),
                    b.setp(Cmp::ge, in[0], kir::imm_s32(static_cast<int32_t>(depth))));
    Reg first = b.setp(Cmp::eq, last_s, kir::imm_s32(0));
    b.if_(b.and_(Type::pred, bad, first), [&] { record_index_error(b, base[2], in[0]); });
    Reg hit = b.setp(Cmp::eq, in[0], last_s);
    return to_store_type(b, dt, b.selp(Type::f32, imm_f32(1.0f), imm_f32(0.0f), hit));
  };
  return single_launch(elementwise_launch(target, "kiln_one_hot", out.shape, {kIn0, kOut0, {ArgRef::Kind::Status, 0}},
                                          {access_of(0, idx, st)}, access_of(1, out, out.shape.strides()), value),
                       "one_hot depth " + std::to_string(depth));
}

}  // namespace

void register_gather_lowering(LoweringTable& t) {
  t.add(PrimId::gather_rows, lower_gather, "thread per element, indices checked");
  t.add(PrimId::gather_last, lower_gather, "thread per output element, indices checked");
  t.add(PrimId::scatter_add_rows, lower_gather, "zero + f32 atomic adds, indices checked");
  t.add(PrimId::one_hot, lower_one_hot, "elementwise, indices checked");
}

}  // namespace kiln::cuda
