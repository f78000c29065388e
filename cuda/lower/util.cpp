// Code-generation helpers shared by the lowerings: index arithmetic, grid-stride loops, value
// and index expressions in kernel IR, and Philox4x32-10.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <unordered_map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/hash.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_s64;
using kir::imm_u32;
using kir::Opc;
using kir::SReg;

Type index_type(const Target& target, int64_t max_elements) {
  return max_elements < (int64_t{1} << 31) && !target.wide_indices ? Type::u32 : Type::u64;
}

Operand imm_index(Type it, int64_t v) {
  return it == Type::u32 ? imm_u32(static_cast<uint32_t>(v)) : kir::imm_u64(static_cast<uint64_t>(v));
}

Reg scaled_add(KernelBuilder& b, Type it, Reg r, int64_t stride, Reg x) {
  return stride == 1 ? b.add(it, r, x) : b.mad(it, r, imm_index(it, stride), x);
}

std::string kernel_name(const std::string& prefix, uint64_t hash) { return fmt::format("{}_{:016x}", prefix, hash); }

kir::Dim3 elementwise_grid(int64_t n) {
  // Enough blocks to fill a large GPU (132 SMs x 16 blocks of 256 threads) without launching
  // one block per 256 elements of a huge tensor: the grid-stride loop covers the rest.
  int64_t blocks = std::clamp<int64_t>((n + kElementwiseThreads - 1) / kElementwiseThreads, 1, 8192);
  return {static_cast<uint32_t>(blocks), 1, 1};
}

void grid_stride_loop(KernelBuilder& b, Type it, int64_t n, const std::function<void(Reg)>& body) {
  Reg gid = b.global_index_x();
  Reg threads = b.mul(Type::u32, b.sreg(SReg::ntid_x), b.sreg(SReg::nctaid_x));
  if (it == Type::u64) {
    gid = b.cvt(Type::u64, gid);
    threads = b.cvt(Type::u64, threads);
  }
  b.for_(gid, imm_index(it, n), threads, body);
}

std::vector<Reg> coordinates(KernelBuilder& b, Reg i, const std::vector<int64_t>& dims) {
  Type it = i.type;
  std::vector<Reg> coords(dims.size());
  Reg rest = i;
  for (size_t k = dims.size(); k-- > 0;) {
    if (k == 0) {
      coords[k] = rest;
    } else if (dims[k] == 1) {
      coords[k] = b.mov(it, imm_index(it, 0));
    } else {
      coords[k] = b.rem(it, rest, imm_index(it, dims[k]));
      rest = b.div(it, rest, imm_index(it, dims[k]));
    }
  }
  return coords;
}

Reg linear_offset(KernelBuilder& b, const std::vector<Reg>& coords, const std::vector<int64_t>& strides, int64_t base) {
  Type it = coords.empty() ? Type::u32 : coords[0].type;
  Reg off = b.mov(it, imm_index(it, base));
  for (size_t k = 0; k < coords.size(); ++k) {
    if (strides[k] == 0) continue;
    off = strides[k] == 1 ? b.add(it, off, coords[k]) : b.mad(it, coords[k], imm_index(it, strides[k]), off);
  }
  return off;
}

std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(static_cast<size_t>(out.rank()), 0), own = in.strides();
  int shift = out.rank() - in.rank();
  for (int a = 0; a < in.rank(); ++a)
    if (in[a] != 1) st[static_cast<size_t>(a + shift)] = own[static_cast<size_t>(a)];
  return st;
}

kir::Type kir_type(DType dt) {
  if (dt == DType::f32) return Type::f32;
  if (dt == DType::i32) return Type::s32;
  if (dt == DType::bf16) return Type::bf16;
  throw Error(std::string("GPU back end: dtype ") + dtype_name(dt) +
              " has no lowering (the GPU runs f32, bf16 and i32)");
}

Reg load_as_f32(KernelBuilder& b, DType dt, Reg base, Reg index) {
  Reg v = b.ld(kir::Space::global, kir_type(dt), b.address(base, index, static_cast<int>(dtype_size(dt))));
  return dt == DType::f32 ? v : b.cvt(Type::f32, v);
}

void store_from_f32(KernelBuilder& b, DType dt, Reg base, Reg index, Reg value) {
  Reg v = dt == DType::f32 ? value : b.cvt(kir_type(dt), value);
  b.st(kir::Space::global, kir_type(dt), b.address(base, index, static_cast<int>(dtype_size(dt))), v);
}

void require_gpu_dtypes(const Circuit& c, const Op& op) {
  auto ok = [&](ValueId v) {
    DType dt = c.info(v).dtype;
    if (dt != DType::f32 && dt != DType::i32 && dt != DType::bf16)
      fail(op.prim->name, op.scope,
           std::string("the GPU back end runs f32, bf16 and i32 tensors, received ") + dtype_name(dt) +
               c.info(v).shape.str() + " (f64 runs on the CPU: --device cpu)");
  };
  for (ValueId v : op.inputs) ok(v);
  for (ValueId v : op.outputs) ok(v);
}

namespace {
uint64_t hash_operand(uint64_t h, const Operand& o) {
  h = hash_combine(h, o.is_imm);
  h = hash_combine(h, static_cast<uint64_t>(o.type));
  return hash_combine(h, o.is_imm ? o.bits : static_cast<uint64_t>(o.reg.index));
}
uint64_t hash_stmts(uint64_t h, const std::vector<kir::Stmt>& body) {
  for (const auto& s : body) {
    h = hash_combine(h, static_cast<uint64_t>(s.kind));
    h = hash_combine(h, (static_cast<uint64_t>(s.guard.type) << 32) ^ static_cast<uint32_t>(s.guard.index));
    h = hash_combine(h, s.negate);
    h = hash_combine(h, (static_cast<uint64_t>(s.cond.type) << 32) ^ static_cast<uint32_t>(s.cond.index));
    h = hash_combine(h, (static_cast<uint64_t>(s.var.type) << 32) ^ static_cast<uint32_t>(s.var.index));
    h = hash_operand(hash_operand(hash_operand(h, s.begin), s.end), s.step);
    const kir::Instr& in = s.instr;
    h = hash_combine(h, static_cast<uint64_t>(in.op) | static_cast<uint64_t>(in.type) << 8 |
                            static_cast<uint64_t>(in.src_type) << 16 | static_cast<uint64_t>(in.cmp) << 24 |
                            static_cast<uint64_t>(in.shfl) << 32 | static_cast<uint64_t>(in.sreg) << 40 |
                            static_cast<uint64_t>(in.space) << 48);
    h = hash_combine(h, static_cast<uint64_t>(in.param) << 32 ^ static_cast<uint32_t>(in.shared));
    h = hash_combine(h, static_cast<uint64_t>(in.vec) << 32 ^ static_cast<uint64_t>(in.offset));
    h = hash_combine(h, static_cast<uint64_t>(in.mma) | static_cast<uint64_t>(in.trans) << 8);
    for (Reg r : in.dsts) h = hash_combine(h, (static_cast<uint64_t>(r.type) << 32) ^ static_cast<uint32_t>(r.index));
    for (const auto& o : in.srcs) h = hash_operand(h, o);
    h = hash_stmts(hash_combine(h, s.body.size()), s.body);
    h = hash_stmts(hash_combine(h, s.else_body.size()), s.else_body);
  }
  return h;
}
}  // namespace

uint64_t kernel_hash(const kir::Kernel& k) {
  uint64_t h = 0x6b696c6e;
  for (const auto& p : k.params) h = hash_combine(hash_combine(h, fnv1a64(p.name)), static_cast<uint64_t>(p.type));
  for (const auto& a : k.shared) {
    h = hash_combine(h, fnv1a64(a.name));
    h = hash_combine(hash_combine(h, static_cast<uint64_t>(a.bytes)), static_cast<uint64_t>(a.align));
  }
  if (k.max_threads > 0) h = hash_combine(h, static_cast<uint64_t>(k.max_threads));
  if (k.max_threads > 0 && k.min_blocks_per_sm > 0)  // printed only with .maxntid
    h = hash_combine(h, 0x6d696e00u + static_cast<uint64_t>(k.min_blocks_per_sm));
  return hash_stmts(hash_combine(h, k.body.size()), k.body);
}

std::string launch_text(const Launch& l) {
  return fmt::format("grid {}x{}x{}, block {}", l.grid.x, l.grid.y, l.grid.z, l.block.x * l.block.y * l.block.z);
}

Reg emit_minmax(KernelBuilder& b, bool is_max, Reg x, Reg y) {
  Reg m = is_max ? b.max(Type::f32, x, y) : b.min(Type::f32, x, y);
  Reg y_nan = b.setp(Cmp::ne, y, y);
  m = b.selp(Type::f32, y, m, y_nan);
  return b.selp(Type::f32, x, m, b.setp(Cmp::ne, x, x));
}

// ---------------------------------------------------------------------------------------------
// Value expressions in f32

namespace {

constexpr float kLog2e = static_cast<float>(std::numbers::log2e);
constexpr float kLn2 = static_cast<float>(std::numbers::ln2);

Reg f_mul(KernelBuilder& b, Operand x, Operand y) { return b.mul(Type::f32, x, y); }
Reg f_add(KernelBuilder& b, Operand x, Operand y) { return b.add(Type::f32, x, y); }

// e^x = 2^(x log2 e). The product is carried in two parts (Cody-Waite: hi = rn(x L), lo = the
// rest, with L = log2 e split in two floats), and 2^lo = 1 + lo ln 2 corrects ex2(hi); without
// this, rounding x log2 e costs up to 64 ulp near |x| = 87. Error: ex2.approx's 2 ulp + ~1 ulp.
Reg emit_exp(KernelBuilder& b, Reg x) {
  const float l_lo = static_cast<float>(std::numbers::log2e - static_cast<double>(kLog2e));
  Reg hi = f_mul(b, x, imm_f32(kLog2e));
  Reg lo = f_add(b, b.fma(Type::f32, x, imm_f32(kLog2e), b.neg(Type::f32, hi)), f_mul(b, x, imm_f32(l_lo)));
  lo = b.selp(Type::f32, imm_f32(0.0f), lo, b.setp(Cmp::eq, b.abs(Type::f32, hi), imm_f32(INFINITY)));
  return f_mul(b, b.unary(Opc::Ex2, Type::f32, hi), b.fma(Type::f32, lo, imm_f32(kLn2), imm_f32(1.0f)));
}

// ln x: lg2.approx has an absolute error (2^-22.6), which is a large relative error where
// ln x is near 0, so for |x - 1| < 1/16 a series in m = x - 1 (exact by Sterbenz) is used:
// m - m^2/2 + ... + m^7/7, dropped terms < 5e-10 relative. Elsewhere the relative error is at
// most 2^-22.6 ln 2 / |ln x| < 2.5e-6.
Reg emit_log(KernelBuilder& b, Reg x) {
  Reg m = b.sub(Type::f32, x, imm_f32(1.0f));
  Reg p = b.mov(Type::f32, imm_f32(1.0f / 7.0f));
  for (float c : {-1.0f / 6.0f, 1.0f / 5.0f, -1.0f / 4.0f, 1.0f / 3.0f, -1.0f / 2.0f, 1.0f})
    p = b.fma(Type::f32, m, p, imm_f32(c));
  Reg series = f_mul(b, m, p);
  Reg general = f_mul(b, b.unary(Opc::Lg2, Type::f32, x), imm_f32(kLn2));
  return b.selp(Type::f32, series, general, b.setp(Cmp::lt, b.abs(Type::f32, m), imm_f32(0.0625f)));
}

// tanh: an odd Taylor polynomial for |x| < 0.125 (where 1 - e^-2|x| would cancel; the first
// dropped term is < 2e-10 relative), else sign(x) (1 - e^-2|x|) / (1 + e^-2|x|).
Reg emit_tanh(KernelBuilder& b, Reg x) {
  Reg ax = b.abs(Type::f32, x);
  Reg t = b.unary(Opc::Ex2, Type::f32, f_mul(b, ax, imm_f32(-2.0f * kLog2e)));
  Reg r = b.div(Type::f32, b.sub(Type::f32, imm_f32(1.0f), t), f_add(b, t, imm_f32(1.0f)));
  Reg signed_r = b.selp(Type::f32, b.neg(Type::f32, r), r, b.setp(Cmp::lt, x, imm_f32(0.0f)));
  Reg x2 = f_mul(b, x, x);
  // x - x^3/3 + 2x^5/15 - 17x^7/315, Horner in x^2.
  Reg p = b.fma(Type::f32, x2, imm_f32(-17.0f / 315.0f), imm_f32(2.0f / 15.0f));
  p = b.fma(Type::f32, x2, p, imm_f32(-1.0f / 3.0f));
  p = b.fma(Type::f32, f_mul(b, x2, x), p, x);
  return b.selp(Type::f32, p, signed_r, b.setp(Cmp::lt, ax, imm_f32(0.125f)));
}

// GELU's (tanh form) shared terms: x^2 and 1 + e with e = exp(-2 k (x + 0.044715 x^3)), k =
// sqrt(2 / pi), the exponent taken in base 2 with log2(e) folded into the constants (relative
// error of e about 2^-22 plus |z| 2^-24: at most about 1e-6 where the result is not 0 or x).
struct GeluTerms {
  Reg x2, one_plus_e;
};
GeluTerms gelu_terms(KernelBuilder& b, Reg x) {
  const double k = std::sqrt(2.0 / std::numbers::pi), c0 = -2.0 * k * std::numbers::log2e;
  Reg x2 = f_mul(b, x, x);
  Reg z =
      f_mul(b, x, b.fma(Type::f32, x2, imm_f32(static_cast<float>(c0 * 0.044715)), imm_f32(static_cast<float>(c0))));
  return {x2, f_add(b, b.unary(Opc::Ex2, Type::f32, z), imm_f32(1.0f))};
}

Reg emit_sigmoid(KernelBuilder& b, Reg x) {
  Reg e = emit_exp(b, b.neg(Type::f32, x));
  return b.div(Type::f32, imm_f32(1.0f), f_add(b, e, imm_f32(1.0f)));
}

// x^y = 2^(y log2|x|), with the sign of a negative base raised to an odd integer, NaN for a
// negative base and a non-integer exponent, and x^0 = 1^y = 1 (as std::pow). Relative error
// about |y log2 x| 2^-22.6 (lg2's absolute error, scaled by y). Every float of magnitude
// >= 2^24 is an even integer; below that, the s32 round trip decides.
Reg emit_pow(KernelBuilder& b, Reg x, Reg y) {
  Reg mag = b.unary(Opc::Ex2, Type::f32, f_mul(b, y, b.unary(Opc::Lg2, Type::f32, b.abs(Type::f32, x))));
  Reg yi = b.cvt(Type::s32, y);
  Reg big = b.setp(Cmp::ge, b.abs(Type::f32, y), imm_f32(16777216.0f));
  Reg y_integral = b.or_(Type::pred, big, b.setp(Cmp::eq, b.cvt(Type::f32, yi), y));
  Reg odd = b.and_(Type::pred, b.setp(Cmp::ne, b.and_(Type::s32, yi, kir::imm_s32(1)), kir::imm_s32(0)),
                   b.setp(Cmp::lt, b.abs(Type::f32, y), imm_f32(16777216.0f)));
  Reg neg_base =
      b.selp(Type::f32, b.selp(Type::f32, b.neg(Type::f32, mag), mag, odd), imm_f32(std::nanf("")), y_integral);
  Reg r = b.selp(Type::f32, neg_base, mag, b.setp(Cmp::lt, x, imm_f32(0.0f)));
  Reg one = b.or_(Type::pred, b.setp(Cmp::eq, y, imm_f32(0.0f)), b.setp(Cmp::eq, x, imm_f32(1.0f)));
  return b.selp(Type::f32, imm_f32(1.0f), r, one);
}

// sin/cos.approx are accurate on [-pi, pi]: reduce x - 2 pi k first (2 pi split in two parts).
Reg emit_trig(KernelBuilder& b, Opc op, Reg x) {
  constexpr double kTwoPi = 2 * std::numbers::pi;
  const float hi = static_cast<float>(kTwoPi), lo = static_cast<float>(kTwoPi - static_cast<double>(hi));
  Reg half = b.selp(Type::f32, imm_f32(0.5f), imm_f32(-0.5f), b.setp(Cmp::ge, x, imm_f32(0.0f)));
  Reg k = b.cvt(Type::f32, b.cvt(Type::s32, b.fma(Type::f32, x, imm_f32(static_cast<float>(1 / kTwoPi)), half)));
  Reg r = b.fma(Type::f32, b.neg(Type::f32, k), imm_f32(hi), x);
  r = b.fma(Type::f32, b.neg(Type::f32, k), imm_f32(lo), r);
  return b.unary(op, Type::f32, r);
}

Reg bool_to_f32(KernelBuilder& b, Reg p) { return b.selp(Type::f32, imm_f32(1.0f), imm_f32(0.0f), p); }

}  // namespace

namespace {
// Emits e once per distinct node: fused bodies share subtrees (a producer substituted into
// several places of its consumer's body), which must not be recomputed per use.
Reg emit_node(KernelBuilder& b, const ScalarExp& e, const std::vector<Reg>& inputs,
              std::unordered_map<const ScalarExp::Node*, Reg>& done);
}  // namespace

Reg emit_scalar_exp(KernelBuilder& b, const ScalarExp& e, const std::vector<Reg>& inputs) {
  std::unordered_map<const ScalarExp::Node*, Reg> done;
  return emit_node(b, e, inputs, done);
}

namespace {
Reg emit_op_of(KernelBuilder& b, const ScalarExp& e, const std::vector<Reg>& a);

Reg emit_node(KernelBuilder& b, const ScalarExp& e, const std::vector<Reg>& inputs,
              std::unordered_map<const ScalarExp::Node*, Reg>& done) {
  if (auto it = done.find(e.node()); it != done.end()) return it->second;
  Reg r;
  if (e.op() == ExpOp::Const) {
    r = b.mov(Type::f32, imm_f32(static_cast<float>(e.const_value())));
  } else if (e.op() == ExpOp::Input) {
    r = inputs.at(static_cast<size_t>(e.input_index()));
  } else {
    std::vector<Reg> a;
    for (const auto& arg : e.args()) a.push_back(emit_node(b, arg, inputs, done));
    r = emit_op_of(b, e, a);
  }
  done.emplace(e.node(), r);
  return r;
}

Reg emit_op_of(KernelBuilder& b, const ScalarExp& e, const std::vector<Reg>& a) {
  switch (e.op()) {
    case ExpOp::Neg: return b.neg(Type::f32, a[0]);
    case ExpOp::Exp: return emit_exp(b, a[0]);
    case ExpOp::Log: return emit_log(b, a[0]);
    case ExpOp::Sqrt: return b.unary(Opc::Sqrt, Type::f32, a[0]);
    case ExpOp::Rsqrt: return b.div(Type::f32, imm_f32(1.0f), b.unary(Opc::Sqrt, Type::f32, a[0]));
    case ExpOp::Tanh: return emit_tanh(b, a[0]);
    case ExpOp::Sigmoid: return emit_sigmoid(b, a[0]);
    case ExpOp::Gelu: {
      // 0.5 x (1 + tanh(u)) with u = k (x + 0.044715 x^3), as the reference, computed as x s with
      // s = sigmoid(2 u) = 1 / (1 + e), e = 2^z, z = -2 u log2(e): the same function, without
      // tanh's 1 - t and 1 + t cancellations, in 6 kernel-IR instructions instead of 23 (one
      // div.rn.f32 in each, which ptxas expands to about ten; GELU was the tensor-core
      // epilogues' main cost). x = -inf gives NaN, as the reference does.
      const GeluTerms g = gelu_terms(b, a[0]);
      return b.div(Type::f32, a[0], g.one_plus_e);
    }
    case ExpOp::GeluGrad: {
      // d/dx [x s] = s + x s (1 - s) u' 2, u' = k (1 + 3 0.044715 x^2) (s as for Gelu). Where e
      // overflows (x below about -10) s = 0 and 1 - s = 1: the gradient is 0 (a finite x u' times
      // 0). s (1 - s) is exactly 0 from about x = 5 up and x = -10 down, so capping x^2 at 1e4
      // changes nothing where it is not; it keeps x u' finite (up to |x| of about 1e35, past
      // which the result is NaN, as the reference's is from |x| of about 1e19).
      const GeluTerms g = gelu_terms(b, a[0]);
      const float k = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
      Reg s = b.div(Type::f32, imm_f32(1.0f), g.one_plus_e);
      Reg capped = b.min(Type::f32, g.x2, imm_f32(1e4f));
      Reg slope = b.fma(Type::f32, capped, imm_f32(2.0f * k * 3.0f * 0.044715f), imm_f32(2.0f * k));
      Reg w = f_mul(b, s, b.sub(Type::f32, imm_f32(1.0f), s));
      return b.fma(Type::f32, w, f_mul(b, a[0], slope), s);
    }
    case ExpOp::Silu: return f_mul(b, a[0], emit_sigmoid(b, a[0]));
    case ExpOp::Sin: return emit_trig(b, Opc::Sin, a[0]);
    case ExpOp::Cos: return emit_trig(b, Opc::Cos, a[0]);
    case ExpOp::Abs: return b.abs(Type::f32, a[0]);
    case ExpOp::RoundBf16: return b.cvt(Type::f32, b.cvt(Type::bf16, a[0]));  // cvt.rn.bf16.f32, then exact
    case ExpOp::Add: return f_add(b, a[0], a[1]);
    case ExpOp::Sub: return b.sub(Type::f32, a[0], a[1]);
    case ExpOp::Mul: return f_mul(b, a[0], a[1]);
    case ExpOp::Div: return b.div(Type::f32, a[0], a[1]);
    case ExpOp::Pow: return emit_pow(b, a[0], a[1]);
    case ExpOp::Max: return emit_minmax(b, true, a[0], a[1]);
    case ExpOp::Min: return emit_minmax(b, false, a[0], a[1]);
    case ExpOp::Lt: return bool_to_f32(b, b.setp(Cmp::lt, a[0], a[1]));
    case ExpOp::Le: return bool_to_f32(b, b.setp(Cmp::le, a[0], a[1]));
    case ExpOp::Gt: return bool_to_f32(b, b.setp(Cmp::gt, a[0], a[1]));
    case ExpOp::Ge: return bool_to_f32(b, b.setp(Cmp::ge, a[0], a[1]));
    case ExpOp::Eq: return bool_to_f32(b, b.setp(Cmp::eq, a[0], a[1]));
    case ExpOp::Ne: return bool_to_f32(b, b.setp(Cmp::ne, a[0], a[1]));
    case ExpOp::Select: return b.selp(Type::f32, a[1], a[2], b.setp(Cmp::ne, a[0], imm_f32(0.0f)));
    case ExpOp::Const:
    case ExpOp::Input: break;
  }
  throw Error(std::string("GPU lowering: ScalarExp op '") + exp_op_name(e.op()) + "' has no lowering");
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Index expressions in s64

Reg emit_index_exp(KernelBuilder& b, const IndexExp& e, const std::vector<Reg>& coords) {
  const Type t = Type::s64;
  switch (e.op()) {
    case IndexOp::Const: return b.mov(t, imm_s64(e.const_value()));
    case IndexOp::Coord: {
      Reg c = coords.at(static_cast<size_t>(e.axis()));
      return c.type == Type::u32 ? b.cvt(t, b.cvt(Type::u64, c)) : b.cvt(t, c);
    }
    default: break;
  }
  const auto& args = e.args();
  if ((e.op() == IndexOp::FloorDiv || e.op() == IndexOp::Mod) &&
      (args[1].op() != IndexOp::Const || args[1].const_value() == 0))
    throw Error("GPU lowering: index expression " + e.str() + " divides by " + args[1].str() +
                "; only nonzero constant divisors have a lowering");
  std::vector<Reg> a;
  for (const auto& arg : args) a.push_back(emit_index_exp(b, arg, coords));
  auto boolean = [&](Cmp c) { return b.selp(t, imm_s64(1), imm_s64(0), b.setp(c, a[0], a[1])); };
  switch (e.op()) {
    case IndexOp::Add: return b.add(t, a[0], a[1]);
    case IndexOp::Sub: return b.sub(t, a[0], a[1]);
    case IndexOp::Mul: return b.mul(t, a[0], a[1]);
    case IndexOp::FloorDiv:
    case IndexOp::Mod: {
      // Truncating division, then the floor correction when the remainder's sign differs
      // from the divisor's (Python semantics, as IndexExp::eval).
      const int64_t d = args[1].const_value();
      Reg q = b.div(t, a[0], imm_s64(d)), r = b.rem(t, a[0], imm_s64(d));
      Reg nonzero = b.setp(Cmp::ne, r, imm_s64(0));
      Reg sign_differs = b.setp(d < 0 ? Cmp::gt : Cmp::lt, r, imm_s64(0));
      Reg fix = b.and_(Type::pred, nonzero, sign_differs);
      if (e.op() == IndexOp::FloorDiv) return b.selp(t, b.sub(t, q, imm_s64(1)), q, fix);
      return b.selp(t, b.add(t, r, imm_s64(d)), r, fix);
    }
    case IndexOp::Min: return b.min(t, a[0], a[1]);
    case IndexOp::Max: return b.max(t, a[0], a[1]);
    case IndexOp::Lt: return boolean(Cmp::lt);
    case IndexOp::Le: return boolean(Cmp::le);
    case IndexOp::Gt: return boolean(Cmp::gt);
    case IndexOp::Ge: return boolean(Cmp::ge);
    case IndexOp::Eq: return boolean(Cmp::eq);
    case IndexOp::Ne: return boolean(Cmp::ne);
    case IndexOp::Select: return b.selp(t, a[1], a[2], b.setp(Cmp::ne, a[0], imm_s64(0)));
    case IndexOp::Const:
    case IndexOp::Coord: break;
  }
  throw Error("GPU lowering: index expression " + e.str() + " has no lowering");
}

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (constants and round as circuit/prims/philox.cpp)

std::vector<Reg> emit_philox(KernelBuilder& b, std::vector<Reg> c, std::vector<Reg> k) {
  const uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u, w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k = {b.add(Type::u32, k[0], imm_u32(w0)), b.add(Type::u32, k[1], imm_u32(w1))};
    }
    Reg hi0 = b.mul_hi(Type::u32, c[0], imm_u32(m0)), lo0 = b.mul(Type::u32, c[0], imm_u32(m0));
    Reg hi1 = b.mul_hi(Type::u32, c[2], imm_u32(m1)), lo1 = b.mul(Type::u32, c[2], imm_u32(m1));
    c = {b.xor_(Type::u32, b.xor_(Type::u32, hi1, c[1]), k[0]), lo1,
         b.xor_(Type::u32, b.xor_(Type::u32, hi0, c[3]), k[1]), lo0};
  }
  return c;
}

}  // namespace kiln::cuda
