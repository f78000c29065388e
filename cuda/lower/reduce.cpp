// Lowering of reductions.
//   reduce along the last axis   x: (rows, n) -> (rows, 1): one block per row; threads stride
//                                over the row, then warp shuffles and shared memory combine
//   reduce along another axis    x: (outer, n, inner) -> (outer, 1, inner): one thread per output,
//                                looping over n (neighbouring threads read neighbouring inner)
//   reduce_all                   x: any -> []: a tree across blocks in one launch, without float
//                                atomics (the result does not depend on scheduling): each block
//                                writes a partial to scratch and counts itself in; the last block
//                                to arrive combines the partials in block order
// Sums are accumulated in f32 in an order other than the reference's: the error bound is the
// usual n * 2^-24 * sum |x| (tests state theirs). Max propagates NaN, as the reference.
#include <algorithm>
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::ShflMode;
using kir::Space;
using kir::SReg;

Reg reduce_combine(KernelBuilder& b, ReduceKind kind, Reg acc, Reg x) {
  return kind == ReduceKind::Max ? emit_minmax(b, true, acc, x) : b.add(Type::f32, acc, x);
}

Operand reduce_identity_operand(ReduceKind kind) { return imm_f32(reduce_identity<float>(kind)); }

Reg warp_reduce(KernelBuilder& b, ReduceKind kind, Reg acc) {
  for (uint32_t off = 16; off >= 1; off /= 2)
    acc = reduce_combine(b, kind, acc, b.shfl(ShflMode::bfly, acc, imm_u32(off)));
  return acc;
}

Reg reduce_finalize(KernelBuilder& b, ReduceKind kind, Reg v, int64_t n) {
  return kind == ReduceKind::Mean ? b.div(Type::f32, v, imm_f32(static_cast<float>(n))) : v;
}

void block_reduce(KernelBuilder& b, ReduceKind kind, Reg acc, uint32_t threads,
                  const std::function<void(Reg)>& emit_result) {
  Reg tid = b.sreg(SReg::tid_x);
  acc = warp_reduce(b, kind, acc);
  if (threads == 32) {
    b.if_(b.setp(Cmp::eq, tid, imm_u32(0)), [&] { emit_result(acc); });
    return;
  }
  const uint32_t warps = threads / 32;
  Reg smem = b.shared_addr(b.shared_array("warp_partials", 4 * warps, 4));
  Reg lane = b.and_(Type::u32, tid, imm_u32(31)), warp = b.shr(Type::u32, tid, imm_u32(5));
  b.if_(b.setp(Cmp::eq, lane, imm_u32(0)),
        [&] { b.st(Space::shared, Type::f32, b.mad(Type::u32, warp, imm_u32(4), smem), acc); });
  b.bar();
  b.if_(b.setp(Cmp::eq, warp, imm_u32(0)), [&] {
    Reg v = b.mov(Type::f32, reduce_identity_operand(kind));
    b.if_(b.setp(Cmp::lt, lane, imm_u32(warps)), [&] {
      Reg s = b.ld(Space::shared, Type::f32, b.mad(Type::u32, lane, imm_u32(4), smem));
      b.set(v, s);
    });
    v = warp_reduce(b, kind, v);
    b.if_(b.setp(Cmp::eq, lane, imm_u32(0)), [&] { emit_result(v); });
  });
}

// The release/acquire chain (PTX memory model): every thread's partials are stored before the
// first bar.sync; thread 0's membar.gl then releases them all and its atomic publishes the
// release; the last block's thread 0 reads every earlier release in its atomic and acquires
// them with the membar.gl after it; the second bar.sync hands them to its block's threads.
void after_last_block(KernelBuilder& b, Reg counter, uint32_t blocks, const std::function<void()>& finish) {
  Reg tid = b.sreg(SReg::tid_x);
  Reg flag = b.shared_addr(b.shared_array("last_block", 4, 4));
  b.bar();  // every thread of the block has stored its partials
  b.if_(b.setp(Cmp::eq, tid, imm_u32(0)), [&] {
    b.membar();  // release: the block's partials are visible before it counts itself in
    Reg ticket = b.atom_add(Space::global, Type::u32, counter, imm_u32(1));
    b.membar();  // acquire: the partials of the blocks counted in before this one
    b.st(Space::shared, Type::u32, flag,
         b.selp(Type::u32, imm_u32(1), imm_u32(0), b.setp(Cmp::eq, ticket, imm_u32(blocks - 1))));
  });
  b.bar();
  b.if_(b.setp(Cmp::ne, b.ld(Space::shared, Type::u32, flag), imm_u32(0)), finish);
}

namespace {

uint32_t block_threads_for(int64_t n) {
  int64_t t = std::clamp<int64_t>((n + 31) / 32 * 32, 32, 256);
  return static_cast<uint32_t>(t);
}

LoweredOp lower_reduce(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& x = c.info(op.inputs[0]);
  const Type it = index_type(target, x.shape.numel());
  LoweredOp r;
  const ArgRef in{ArgRef::Kind::Input, 0}, out{ArgRef::Kind::Output, 0}, scratch{ArgRef::Kind::Scratch, 0};
  if (op.is(PrimId::reduce_all)) {
    const ReduceKind kind = ReduceParams::of(op).kind;
    const int64_t n = x.shape.numel();
    const uint32_t threads = 256;
    const int64_t blocks = std::clamp<int64_t>((n + threads * 4 - 1) / (threads * 4), 1, 1024);
    r.scratch_bytes = {static_cast<size_t>(blocks) * 4, 4};  // partials, arrival counter
    r.zeroed_scratch = {1};
    KernelBuilder b("kiln_reduce_all");
    Reg xp = b.param("x", Type::u64), y = b.param("y", Type::u64);
    Reg part = b.param("partials", Type::u64), counter = b.param("counter", Type::u64);
    Reg acc = b.mov(Type::f32, reduce_identity_operand(kind));
    grid_stride_loop(b, it, n, [&](Reg i) {
      b.set(acc, reduce_combine(b, kind, acc, b.ld(Space::global, Type::f32, b.address(xp, i, 4))));
    });
    block_reduce(b, kind, acc, threads,
                 [&](Reg v) { b.st(Space::global, Type::f32, b.address(part, b.sreg(SReg::ctaid_x), 4), v); });
    after_last_block(b, counter, static_cast<uint32_t>(blocks), [&] {
      Reg total = b.mov(Type::f32, reduce_identity_operand(kind));
      b.for_(b.sreg(SReg::tid_x), imm_u32(static_cast<uint32_t>(blocks)), imm_u32(threads), [&](Reg j) {
        b.set(total, reduce_combine(b, kind, total, b.ld(Space::global, Type::f32, b.address(part, j, 4))));
      });
      block_reduce(b, kind, total, threads,
                   [&](Reg v) { b.st(Space::global, Type::f32, y, reduce_finalize(b, kind, v, n)); });
    });
    r.launches.push_back(finish_launch(b, "kiln_reduce_all", {static_cast<uint32_t>(blocks), 1, 1}, {threads, 1, 1},
                                       {in, out, scratch, {ArgRef::Kind::Scratch, 1}}));
    r.summary = std::string("reduce_all ") + reduce_kind_name(kind) + ": " + std::to_string(blocks) +
                " block partials, the last block to finish combines them";
    return r;
  }
  const ReduceParams rp = ReduceParams::of(op);
  const ReduceKind kind = rp.kind;
  const int axis = rp.axis;
  int64_t outer = 1, inner = 1;
  const int64_t n = x.shape[axis];
  for (int a = 0; a < axis; ++a) outer *= x.shape[a];
  for (int a = axis + 1; a < x.shape.rank(); ++a) inner *= x.shape[a];
  if (inner == 1) {
    const uint32_t threads = block_threads_for(n);
    KernelBuilder b("kiln_reduce_row");
    Reg xp = b.param("x", Type::u64), y = b.param("y", Type::u64);
    Reg row = b.sreg(SReg::ctaid_x);
    Reg row_i = it == Type::u32 ? row : b.cvt(Type::u64, row);
    Reg start = b.mul(it, row_i, imm_index(it, n));
    Reg acc = b.mov(Type::f32, reduce_identity_operand(kind));
    Reg tid = b.sreg(SReg::tid_x);
    b.for_(it == Type::u32 ? tid : b.cvt(Type::u64, tid), imm_index(it, n), imm_index(it, threads), [&](Reg j) {
      Reg v = b.ld(Space::global, Type::f32, b.address(xp, b.add(it, start, j), 4));
      b.set(acc, reduce_combine(b, kind, acc, v));
    });
    block_reduce(b, kind, acc, threads,
                 [&](Reg v) { b.st(Space::global, Type::f32, b.address(y, row, 4), reduce_finalize(b, kind, v, n)); });
    if (outer > 0x7fffffff) fail(op.prim->name, op.scope, "more than 2^31 - 1 rows");
    r.launches.push_back(
        finish_launch(b, "kiln_reduce_row", {static_cast<uint32_t>(outer), 1, 1}, {threads, 1, 1}, {in, out}));
    r.summary = std::string("reduce ") + reduce_kind_name(kind) + " of rows: one block per row";
  } else {
    KernelBuilder b("kiln_reduce_axis");
    Reg xp = b.param("x", Type::u64), y = b.param("y", Type::u64);
    grid_stride_loop(b, it, outer * inner, [&](Reg o) {
      Reg oi = b.div(it, o, imm_index(it, inner)), ii = b.rem(it, o, imm_index(it, inner));
      Reg base = b.mad(it, oi, imm_index(it, n * inner), ii);
      Reg acc = b.mov(Type::f32, reduce_identity_operand(kind));
      b.for_(imm_index(it, 0), imm_index(it, n), imm_index(it, 1), [&](Reg j) {
        Reg v = b.ld(Space::global, Type::f32, b.address(xp, b.mad(it, j, imm_index(it, inner), base), 4));
        b.set(acc, reduce_combine(b, kind, acc, v));
      });
      b.st(Space::global, Type::f32, b.address(y, o, 4), reduce_finalize(b, kind, acc, n));
    });
    r.launches.push_back(
        finish_launch(b, "kiln_reduce_axis", elementwise_grid(outer * inner), {kElementwiseThreads, 1, 1}, {in, out}));
    r.summary = std::string("reduce ") + reduce_kind_name(kind) + " along axis " + std::to_string(axis) +
                ": one thread per output";
  }
  r.summary += ", " + launch_text(r.launches.back());
  return r;
}

}  // namespace

void register_reduce_lowering(LoweringTable& t) {
  t.add(PrimId::reduce, lower_reduce, "rows: block per row (shuffles + shared); other axes: thread per output");
  t.add(PrimId::reduce_all, lower_reduce, "tree: block partials, then one block (no atomics)");
}

}  // namespace kiln::cuda
