// Lowering of cast and stop_gradient (circuit/prims/cast.cpp): an elementwise cvt; stop_gradient
// shares its input's buffer (no kernel). The cast of a whole f32 tensor to bf16 (the matmul
// operands of --precision bf16: about 150 a GPT-2 step) moves 8 elements a thread at a time,
// two 16-byte loads and one 16-byte store of cvt.rn.bf16x2 pairs: one element a thread, with one
// 4-byte load in flight, ran at about 570 GB/s on an H100.
#include <string>

#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

namespace {

using kir::Cmp;
using kir::Space;

// f32 -> bf16 over n contiguous elements: element groups of 8 a thread (grid-stride) where both
// buffers are 16-byte aligned, then the last n % 8 elements one a thread; one a thread
// throughout where either buffer is not aligned (a view into another buffer).
Launch packed_bf16_cast(const Target& target, int64_t n) {
  const Type it = index_type(target, n);
  KernelBuilder b("kiln_cast_bf16x8");
  Reg in = b.param("in", Type::u64), out = b.param("out", Type::u64);
  const int64_t groups = n / 8;
  auto one_at_a_time = [&](Operand first) {
    Reg gid = b.global_index_x(), threads = b.mul(Type::u32, b.sreg(kir::SReg::ntid_x), b.sreg(kir::SReg::nctaid_x));
    Reg start = b.add(it, first, it == Type::u64 ? b.cvt(Type::u64, gid) : gid);
    b.for_(start, imm_index(it, n), it == Type::u64 ? Operand(b.cvt(Type::u64, threads)) : Operand(threads),
           [&](Reg i) {
             Reg x = b.ld(Space::global, Type::f32, b.address(in, i, 4));
             b.st(Space::global, Type::bf16, b.address(out, i, 2), b.cvt(Type::bf16, x));
           });
  };
  Reg aligned = b.setp(Cmp::eq, b.and_(Type::u64, b.or_(Type::u64, in, out), kir::imm_u64(15)), kir::imm_u64(0));
  b.if_(
      aligned,
      [&] {
        grid_stride_loop(b, it, groups, [&](Reg g) {
          Reg src = b.address(in, g, 32);
          std::vector<Reg> lo = b.ld_vec(Space::global, Type::f32, src, 4),
                           hi = b.ld_vec(Space::global, Type::f32, src, 4, 16);
          b.st_vec(Space::global, Type::u32, b.address(out, g, 16),
                   {b.pack_bf16x2(lo[0], lo[1]), b.pack_bf16x2(lo[2], lo[3]), b.pack_bf16x2(hi[0], hi[1]),
                    b.pack_bf16x2(hi[2], hi[3])});
        });
        if (n % 8 != 0) one_at_a_time(imm_index(it, 8 * groups));
      },
      [&] { one_at_a_time(imm_index(it, 0)); });
  return finish_launch(b, "kiln_cast_bf16x8", elementwise_grid(std::max<int64_t>(groups, 1)),
                       {kElementwiseThreads, 1, 1}, {kIn0, kOut0});
}

LoweredOp lower_cast(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& x = c.info(op.inputs[0]);
  const ValueInfo& out = c.info(op.outputs[0]);
  const DType to = out.dtype;
  if (x.dtype == DType::f32 && to == DType::bf16 && x.shape == out.shape)
    return single_launch(packed_bf16_cast(target, out.shape.numel()), "cast f32 -> bf16, 8 elements a thread");
  // Between i32 and bf16 through f32, as the host converts (and sm_80 has no cvt between them).
  auto value = [to](KernelBuilder& b, const std::vector<Reg>& in, const std::vector<Reg>&, const std::vector<Reg>&) {
    Reg x = in[0];
    const Type t = kir_type(to);
    if (x.type == t) return x;
    if ((x.type == Type::s32 && t == Type::bf16) || (x.type == Type::bf16 && t == Type::s32)) x = b.cvt(Type::f32, x);
    return b.cvt(t, x);
  };
  return single_launch(
      elementwise_launch(target, "kiln_cast", out.shape, {kIn0, kOut0}, {access_of(0, x, x.shape.strides())},
                         access_of(1, out, out.shape.strides()), value),
      std::string("cast ") + dtype_name(x.dtype) + " -> " + dtype_name(to));
}

}  // namespace

void register_cast_lowering(LoweringTable& t) {
  t.add(PrimId::cast, lower_cast, "elementwise cvt");
  t.add_alias(PrimId::stop_gradient, 0, "alias (no kernel)");
}

}  // namespace kiln::cuda
