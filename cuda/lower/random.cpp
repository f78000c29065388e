// Lowering of random (circuit/prims/random.cpp): Philox4x32-10 in kernel IR, one thread per
// element, producing the reference's bits (uniform, normal by Box-Muller, Bernoulli by an exact
// integer threshold).
#include <cmath>
#include <string>

#include <kiln/circuit/prims/prim_params.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/families.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;

namespace {

LoweredOp lower_random(const Circuit& c, const Op& op, const Target& target) {
  const ValueInfo& out = c.info(op.outputs[0]);
  const RandomParams rp = RandomParams::of(op);
  const RandomKind kind = rp.kind;
  // u < p <=> (bits >> 8) < p * 2^24 <=> (bits >> 8) < ceil(p * 2^24): an exact integer test,
  // so Bernoulli masks are bit-identical to the reference's.
  const double threshold = std::ceil(rp.probability * 16777216.0);
  const DType dt = out.dtype;
  auto value = [kind, threshold, dt](KernelBuilder& b, const std::vector<Reg>&, const std::vector<Reg>& coords,
                                     const std::vector<Reg>& base) {
    Reg i = coords[0];  // the flat element index (the domain is 1-D)
    Reg i64 = i.type == Type::u64 ? i : b.cvt(Type::u64, i);
    Reg key0 = b.ld(Space::global, Type::u32, base[0]), key1 = b.ld(Space::global, Type::u32, base[0], 4);
    Reg offset = b.ld(Space::global, Type::u32, base[1]);
    // Uniform and Bernoulli take word i % 4 of counter block i / 4; normal takes words 2i % 4
    // and 2i % 4 + 1 of block 2i / 4 = i / 2.
    const bool normal = kind == RandomKind::Normal;
    Reg block = b.shr(Type::u64, i64, imm_u32(normal ? 1 : 2));
    Reg word = b.cvt(Type::u32, b.and_(Type::u64, i64, kir::imm_u64(normal ? 1 : 3)));
    if (normal) word = b.shl(Type::u32, word, imm_u32(1));
    std::vector<Reg> r = emit_philox(b,
                                     {b.cvt(Type::u32, block), b.cvt(Type::u32, b.shr(Type::u64, block, imm_u32(32))),
                                      offset, b.mov(Type::u32, imm_u32(0))},
                                     {key0, key1});
    auto pick = [&](Reg w) {
      Reg v = r[3];
      for (int k = 2; k >= 0; --k) v = b.selp(Type::u32, r[static_cast<size_t>(k)], v, b.setp(Cmp::eq, w, imm_u32(k)));
      return v;
    };
    auto uniform = [&](Reg bits) {
      return b.mul(Type::f32, b.cvt(Type::f32, b.shr(Type::u32, bits, imm_u32(8))), imm_f32(1.0f / 16777216.0f));
    };
    Reg v;
    if (kind == RandomKind::Uniform) {
      v = uniform(pick(word));
    } else if (kind == RandomKind::Bernoulli) {
      Reg hi = b.shr(Type::u32, pick(word), imm_u32(8));
      Operand t = threshold >= 16777216.0 ? Operand(imm_u32(16777216u)) : imm_u32(static_cast<uint32_t>(threshold));
      v = b.selp(Type::f32, imm_f32(1.0f), imm_f32(0.0f), b.setp(Cmp::lt, hi, t));
    } else {
      Reg u1 = uniform(pick(word)), u2 = uniform(pick(b.add(Type::u32, word, imm_u32(1))));
      Reg one_minus = b.sub(Type::f32, imm_f32(1.0f), u1);
      Reg lg = b.unary(kir::Opc::Lg2, Type::f32, one_minus);
      // lg2.approx's absolute error can make lg2(1 - u1) slightly positive for u1 near 0:
      // clamp so the radius is never the sqrt of a negative.
      Reg r2 = b.max(Type::f32, b.mul(Type::f32, lg, imm_f32(static_cast<float>(-2.0 * M_LN2))), imm_f32(0.0f));
      Reg radius = b.unary(kir::Opc::Sqrt, Type::f32, r2);
      Reg angle = b.mul(Type::f32, u2, imm_f32(static_cast<float>(2 * M_PI)));
      v = b.mul(Type::f32, radius, emit_scalar_exp(b, se::cos(se::in(0)), {angle}));
    }
    return to_store_type(b, dt, v);
  };
  Shape flat{out.shape.numel()};
  ValueInfo flat_out{flat, out.dtype};
  static const char* kKinds[] = {"uniform", "normal", "bernoulli"};
  return single_launch(
      elementwise_launch(target, "kiln_random", flat, {kIn0, kIn1, kOut0}, {}, access_of(2, flat_out, {1}), value,
                         true),
      std::string("random ") + kKinds[static_cast<size_t>(kind)] + " (Philox4x32-10, the reference's bits)");
}

}  // namespace

void register_random_lowering(LoweringTable& t) {
  t.add(PrimId::random, lower_random, "Philox4x32-10 in kernel IR, same bits");
}

}  // namespace kiln::cuda
