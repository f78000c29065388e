// Kernel IR: type helpers, the Kernel's shared-memory layout, describe() and the builder. The
// structural checker (check(), needs_sm90a()) is in kir_check.cpp.
#include <bit>
#include <cstddef>
#include <cstring>
#include <iterator>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/kir/kir.hpp>

namespace kiln::kir {

const char* type_name(Type t) {
  static const char* kNames[] = {"pred", "u32", "s32", "u64", "s64", "f32", "f64", "f16", "bf16"};
  return kNames[static_cast<int>(t)];
}

int type_bytes(Type t) {
  static const int kBytes[] = {1, 4, 4, 8, 8, 4, 8, 2, 2};
  return kBytes[static_cast<int>(t)];
}

bool is_float_type(Type t) { return t == Type::f32 || t == Type::f64 || t == Type::f16 || t == Type::bf16; }
bool is_signed_type(Type t) { return t == Type::s32 || t == Type::s64; }

const char* sreg_name(SReg s) {
  static const char* kNames[] = {"%tid.x",   "%tid.y",   "%tid.z",    "%ntid.x",   "%ntid.y",   "%ntid.z", "%ctaid.x",
                                 "%ctaid.y", "%ctaid.z", "%nctaid.x", "%nctaid.y", "%nctaid.z", "%laneid"};
  return kNames[static_cast<int>(s)];
}

const char* mma_shape_name(MmaShape s) {
  switch (s) {
    case MmaShape::m16n8k8_tf32: return "m16n8k8.row.col.f32.tf32.tf32.f32";
    case MmaShape::m16n8k16_bf16: return "m16n8k16.row.col.f32.bf16.bf16.f32";
    case MmaShape::m16n8k16_f16: return "m16n8k16.row.col.f32.f16.f16.f32";
  }
  return "?";
}

namespace {

using G = OpcGroup;
constexpr OpcInfo kOpcodes[] = {
    {Opc::Mov, "mov", G::arith, false, 0},
    {Opc::Add, "add", G::arith, false, 0},
    {Opc::Sub, "sub", G::arith, false, 0},
    {Opc::Mul, "mul", G::arith, false, 0},
    {Opc::MulHi, "mul.hi", G::arith, false, 0},
    {Opc::MulWide, "mul.wide", G::arith, false, 0},
    {Opc::Mad, "mad", G::arith, false, 0},
    {Opc::Fma, "fma", G::arith, false, 0},
    {Opc::Div, "div", G::arith, false, 0},
    {Opc::Rem, "rem", G::arith, false, 0},
    {Opc::Min, "min", G::arith, false, 0},
    {Opc::Max, "max", G::arith, false, 0},
    {Opc::Neg, "neg", G::arith, false, 0},
    {Opc::Abs, "abs", G::arith, false, 0},
    {Opc::And, "and", G::arith, false, 0},
    {Opc::Or, "or", G::arith, false, 0},
    {Opc::Xor, "xor", G::arith, false, 0},
    {Opc::Not, "not", G::arith, false, 0},
    {Opc::Shl, "shl", G::arith, false, 0},
    {Opc::Shr, "shr", G::arith, false, 0},
    {Opc::Setp, "setp", G::arith, false, 0},
    {Opc::Selp, "selp", G::arith, false, 0},
    {Opc::Cvt, "cvt", G::arith, false, 0},
    {Opc::Ex2, "ex2", G::arith, false, 0},
    {Opc::Lg2, "lg2", G::arith, false, 0},
    {Opc::Rcp, "rcp", G::arith, false, 0},
    {Opc::Rsqrt, "rsqrt", G::arith, false, 0},
    {Opc::Sqrt, "sqrt", G::arith, false, 0},
    {Opc::Tanh, "tanh", G::arith, false, 0},
    {Opc::Sin, "sin", G::arith, false, 0},
    {Opc::Cos, "cos", G::arith, false, 0},
    {Opc::LdParam, "ld.param", G::memory, false, 0},
    {Opc::Sreg, "sreg", G::memory, false, 0},
    {Opc::SharedAddr, "shared.addr", G::memory, false, 0},
    {Opc::Ld, "ld", G::memory, false, 0},
    {Opc::St, "st", G::memory, false, 0},
    {Opc::AtomAdd, "atom.add", G::memory, false, 0},
    {Opc::Bar, "bar.sync", G::sync, false, 0},
    {Opc::Shfl, "shfl.sync", G::sync, false, 0},
    {Opc::Ret, "ret", G::sync, false, 0},
    {Opc::Membar, "membar.gl", G::sync, false, 0},
    {Opc::Mma, "mma.sync", G::matrix, false, 0},
    {Opc::RoundTf32, "cvt.rna.tf32", G::arith, false, 0},
    {Opc::Ldmatrix, "ldmatrix", G::matrix, false, 0},
    {Opc::CpAsync, "cp.async", G::async_copy, false, 0},
    {Opc::CpAsyncCommit, "cp.async.commit_group", G::async_copy, false, 0},
    {Opc::CpAsyncWait, "cp.async.wait_group", G::async_copy, false, 0},
    {Opc::PackBf16x2, "cvt.rn.bf16x2", G::arith, false, 0},
    {Opc::Wgmma, "wgmma.mma_async", G::matrix, true, 80},
    {Opc::WgmmaFence, "wgmma.fence", G::matrix, true, 80},
    {Opc::WgmmaCommit, "wgmma.commit_group", G::matrix, true, 80},
    {Opc::WgmmaWait, "wgmma.wait_group", G::matrix, true, 80},
    {Opc::FenceProxyAsync, "fence.proxy.async", G::matrix, true, 80},
    {Opc::MbarrierInit, "mbarrier.init", G::async_copy, true, 80},
    {Opc::FenceMbarrierInit, "fence.mbarrier_init", G::async_copy, true, 80},
    {Opc::MbarrierArriveExpectTx, "mbarrier.arrive.expect_tx", G::async_copy, true, 80},
    {Opc::MbarrierWait, "mbarrier.try_wait.parity", G::async_copy, true, 80},
    {Opc::TensorCopy, "cp.async.bulk.tensor", G::async_copy, true, 80},
    {Opc::FenceProxyTensormap, "fence.proxy.tensormap", G::async_copy, true, 83},
};

// Every opcode once, in Opc order, so that opc_info indexes the table: an opcode added to Opc
// without its row here (or out of order) fails to compile.
constexpr bool table_in_order() {
  for (size_t i = 0; i < std::size(kOpcodes); ++i)
    if (static_cast<size_t>(kOpcodes[i].op) != i) return false;
  // The printer applies min_ptx to sm_90a kernels only (the others print 7.1 or 7.8).
  for (const OpcInfo& o : kOpcodes)
    if (o.min_ptx > 0 && !o.sm90a) return false;
  return static_cast<size_t>(kLastOpc) + 1 == std::size(kOpcodes);
}
static_assert(table_in_order(), "kOpcodes must list every Opc once, in the enum's order (min_ptx: sm_90a only)");

}  // namespace

const OpcInfo& opc_info(Opc op) { return kOpcodes[static_cast<size_t>(op)]; }

Operand Operand::imm(Type t, uint64_t bits) {
  Operand o;
  o.is_imm = true;
  o.type = t;
  o.bits = bits;
  return o;
}
Operand imm_u32(uint32_t v) { return Operand::imm(Type::u32, v); }
Operand imm_s32(int32_t v) { return Operand::imm(Type::s32, static_cast<uint32_t>(v)); }
Operand imm_u64(uint64_t v) { return Operand::imm(Type::u64, v); }
Operand imm_s64(int64_t v) { return Operand::imm(Type::s64, static_cast<uint64_t>(v)); }
Operand imm_f32(float v) { return Operand::imm(Type::f32, std::bit_cast<uint32_t>(v)); }
Operand imm_f64(double v) { return Operand::imm(Type::f64, std::bit_cast<uint64_t>(v)); }

int64_t Kernel::shared_offset(int array) const {
  int64_t off = 0;
  for (int i = 0; i <= array; ++i) {
    const auto& a = shared[static_cast<size_t>(i)];
    off = (off + a.align - 1) / a.align * a.align;
    if (i == array) return off;
    off += a.bytes;
  }
  return off;
}

int64_t Kernel::shared_bytes() const {
  if (shared.empty()) return 0;
  int last = static_cast<int>(shared.size()) - 1;
  return shared_offset(last) + shared.back().bytes;
}

int64_t Kernel::dynamic_shared_bytes() const {
  const int64_t bytes = shared_bytes();
  return bytes > kStaticSharedLimit ? bytes : 0;
}

std::string describe(const Kernel& k, const Instr& in) {
  auto reg = [](Reg r) { return std::string(type_name(r.type)) + "#" + std::to_string(r.index); };
  auto opnd = [&](const Operand& o) {
    return o.is_imm ? std::string(type_name(o.type)) + " imm " + std::to_string(o.bits) : reg(o.reg);
  };
  std::string s = std::string(opc_name(in.op)) + "." + type_name(in.type);
  if (in.op == Opc::Ld || in.op == Opc::St || in.op == Opc::AtomAdd)
    s += in.space == Space::shared ? " shared" : " global";
  for (size_t i = 0; i < in.dsts.size(); ++i) s += (i ? ", " : " ") + reg(in.dsts[i]);
  for (size_t i = 0; i < in.srcs.size(); ++i) s += (i || !in.dsts.empty() ? ", " : " ") + opnd(in.srcs[i]);
  if (in.offset) s += " +" + std::to_string(in.offset);
  return s + " (kernel " + k.name + ")";
}

// ---------------------------------------------------------------------------------------------
// Builder

KernelBuilder::KernelBuilder(std::string name) {
  k_.name = std::move(name);
  stack_.push_back(&k_.body);
}

Reg KernelBuilder::reg(Type t) { return Reg{t, k_.num_regs[static_cast<int>(t)]++}; }

void KernelBuilder::emit(Instr in, Reg guard, bool negate) {
  Stmt s;
  s.kind = Stmt::Kind::Instr;
  s.instr = std::move(in);
  s.guard = guard;
  s.negate = negate;
  stack_.back()->push_back(std::move(s));
}

Reg KernelBuilder::emit_op(Opc op, Type t, std::vector<Operand> srcs, Type dst_type) {
  Instr in;
  in.op = op;
  in.type = t;
  in.srcs = std::move(srcs);
  Reg d = reg(dst_type);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}

void KernelBuilder::emit_effect(Opc op, std::vector<Operand> srcs, Type t, Space space, int64_t offset) {
  Instr in;
  in.op = op;
  in.type = t;
  in.space = space;
  in.offset = offset;
  in.srcs = std::move(srcs);
  emit(std::move(in));
}

Reg KernelBuilder::param(const std::string& name, Type t) {
  k_.params.push_back({name, t});
  Instr in;
  in.op = Opc::LdParam;
  in.type = t;
  in.param = static_cast<int32_t>(k_.params.size()) - 1;
  Reg d = reg(t);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}

int KernelBuilder::shared_array(const std::string& name, int64_t bytes, int32_t align) {
  bool taken = false;  // a helper called twice (two block reductions) asks for its name twice
  for (const auto& a : k_.shared) taken = taken || a.name == name;
  k_.shared.push_back({taken ? name + "_" + std::to_string(k_.shared.size()) : name, bytes, align});
  return static_cast<int>(k_.shared.size()) - 1;
}

Reg KernelBuilder::shared_addr(int array) {
  Instr in;
  in.op = Opc::SharedAddr;
  in.type = Type::u32;
  in.shared = array;
  Reg d = reg(Type::u32);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}

Reg KernelBuilder::sreg(SReg s) {
  Instr in;
  in.op = Opc::Sreg;
  in.type = Type::u32;
  in.sreg = s;
  Reg d = reg(Type::u32);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}

Reg KernelBuilder::mov(Type t, Operand a) { return emit_op(Opc::Mov, t, {a}, t); }
void KernelBuilder::assign(Opc op, Reg dst, std::vector<Operand> srcs) {
  Instr in;
  in.op = op;
  in.type = dst.type;
  in.dsts = {dst};
  in.srcs = std::move(srcs);
  emit(std::move(in));
}
Reg KernelBuilder::add(Type t, Operand a, Operand b) { return emit_op(Opc::Add, t, {a, b}, t); }
Reg KernelBuilder::sub(Type t, Operand a, Operand b) { return emit_op(Opc::Sub, t, {a, b}, t); }
Reg KernelBuilder::mul(Type t, Operand a, Operand b) { return emit_op(Opc::Mul, t, {a, b}, t); }
Reg KernelBuilder::mul_hi(Type t, Operand a, Operand b) { return emit_op(Opc::MulHi, t, {a, b}, t); }
Reg KernelBuilder::mul_wide(Type src, Operand a, Operand b) {
  return emit_op(Opc::MulWide, src, {a, b}, src == Type::u32 ? Type::u64 : Type::s64);
}
Reg KernelBuilder::mad(Type t, Operand a, Operand b, Operand c) { return emit_op(Opc::Mad, t, {a, b, c}, t); }
Reg KernelBuilder::fma(Type t, Operand a, Operand b, Operand c) { return emit_op(Opc::Fma, t, {a, b, c}, t); }
namespace {
// An unsigned 64-bit divisor known at lowering time (an immediate above 0).
bool u64_constant_divisor(Type t, const Operand& b) { return t == Type::u64 && b.is_imm && b.bits != 0; }
}  // namespace

// ptxas turns div/rem.u64 into a call of about 60 instructions, even by a constant (32-bit
// ones it strength-reduces itself). A constant divisor becomes a shift, or a multiply-high and
// shifts (Granlund and Montgomery, "Division by invariant integers using multiplication",
// fig. 4.1, N = 64): l = ceil(log2 d), m = floor(2^64 (2^l - d) / d) + 1,
// t = mulhi(m, n), q = (t + ((n - t) >> 1)) >> (l - 1); exact for every n < 2^64.
Reg KernelBuilder::div(Type t, Operand a, Operand b) {
  if (!u64_constant_divisor(t, b)) return emit_op(Opc::Div, t, {a, b}, t);
  const uint64_t d = b.bits;
  if (d == 1) return mov(t, a);
  if (std::has_single_bit(d)) return shr(t, a, imm_u32(static_cast<uint32_t>(std::countr_zero(d))));
  const int l = 64 - std::countl_zero(d - 1);  // ceil(log2 d), 2..64
  const auto m = static_cast<uint64_t>(
      ((static_cast<unsigned __int128>(1) << 64) * ((static_cast<unsigned __int128>(1) << l) - d)) / d + 1);
  Reg hi = mul_hi(t, a, imm_u64(m));
  Reg half = shr(t, sub(t, a, hi), imm_u32(1));
  return shr(t, add(t, hi, half), imm_u32(static_cast<uint32_t>(l - 1)));
}
Reg KernelBuilder::rem(Type t, Operand a, Operand b) {
  if (!u64_constant_divisor(t, b)) return emit_op(Opc::Rem, t, {a, b}, t);
  if (std::has_single_bit(b.bits)) return and_(t, a, imm_u64(b.bits - 1));
  return sub(t, a, mul(t, div(t, a, b), b));
}
Reg KernelBuilder::min(Type t, Operand a, Operand b) { return emit_op(Opc::Min, t, {a, b}, t); }
Reg KernelBuilder::max(Type t, Operand a, Operand b) { return emit_op(Opc::Max, t, {a, b}, t); }
Reg KernelBuilder::neg(Type t, Operand a) { return emit_op(Opc::Neg, t, {a}, t); }
Reg KernelBuilder::abs(Type t, Operand a) { return emit_op(Opc::Abs, t, {a}, t); }
Reg KernelBuilder::and_(Type t, Operand a, Operand b) { return emit_op(Opc::And, t, {a, b}, t); }
Reg KernelBuilder::or_(Type t, Operand a, Operand b) { return emit_op(Opc::Or, t, {a, b}, t); }
Reg KernelBuilder::xor_(Type t, Operand a, Operand b) { return emit_op(Opc::Xor, t, {a, b}, t); }
Reg KernelBuilder::not_(Type t, Operand a) { return emit_op(Opc::Not, t, {a}, t); }
Reg KernelBuilder::shl(Type t, Operand a, Operand b) { return emit_op(Opc::Shl, t, {a, b}, t); }
Reg KernelBuilder::shr(Type t, Operand a, Operand b) { return emit_op(Opc::Shr, t, {a, b}, t); }
Reg KernelBuilder::setp(Cmp c, Operand a, Operand b) {
  Instr in;
  in.op = Opc::Setp;
  in.type = a.type;
  in.cmp = c;
  in.srcs = {a, b};
  Reg d = reg(Type::pred);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}
Reg KernelBuilder::selp(Type t, Operand a, Operand b, Operand c) { return emit_op(Opc::Selp, t, {a, b, c}, t); }
Reg KernelBuilder::cvt(Type to, Operand a) {
  Instr in;
  in.op = Opc::Cvt;
  in.type = to;
  in.src_type = a.type;
  in.srcs = {a};
  Reg d = reg(to);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}
Reg KernelBuilder::unary(Opc op, Type t, Operand a) { return emit_op(op, t, {a}, t); }

Reg KernelBuilder::ld(Space s, Type t, Operand addr, int64_t offset) { return ld_vec(s, t, addr, 1, offset)[0]; }

std::vector<Reg> KernelBuilder::ld_vec(Space s, Type t, Operand addr, int vec, int64_t offset) {
  Instr in;
  in.op = Opc::Ld;
  in.type = t;
  in.space = s;
  in.vec = vec;
  in.offset = offset;
  in.srcs = {addr};
  for (int i = 0; i < vec; ++i) in.dsts.push_back(reg(t));
  std::vector<Reg> out = in.dsts;
  emit(std::move(in));
  return out;
}

void KernelBuilder::st(Space s, Type t, Operand addr, Operand value, int64_t offset) {
  st_vec(s, t, addr, {value}, offset);
}

void KernelBuilder::st_vec(Space s, Type t, Operand addr, const std::vector<Operand>& values, int64_t offset) {
  Instr in;
  in.op = Opc::St;
  in.type = t;
  in.space = s;
  in.vec = static_cast<int32_t>(values.size());
  in.offset = offset;
  in.srcs = {addr};
  in.srcs.insert(in.srcs.end(), values.begin(), values.end());
  emit(std::move(in));
}

Reg KernelBuilder::atom_add(Space s, Type t, Operand addr, Operand value, int64_t offset) {
  Instr in;
  in.op = Opc::AtomAdd;
  in.type = t;
  in.space = s;
  in.offset = offset;
  in.srcs = {addr, value};
  Reg d = reg(t);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}

void KernelBuilder::bar() { emit_effect(Opc::Bar); }

Reg KernelBuilder::shfl(ShflMode m, Operand value, Operand lane_or_delta, Operand clamp) {
  Instr in;
  in.op = Opc::Shfl;
  in.type = value.type;
  in.shfl = m;
  in.srcs = {value, lane_or_delta, clamp};
  Reg d = reg(value.type);
  in.dsts = {d};
  emit(std::move(in));
  return d;
}

std::vector<Reg> KernelBuilder::mma(MmaShape shape, const std::vector<Operand>& a, const std::vector<Operand>& b,
                                    const std::vector<Operand>& c) {
  Instr in;
  in.op = Opc::Mma;
  in.type = Type::f32;
  in.mma = shape;
  in.srcs = a;
  in.srcs.insert(in.srcs.end(), b.begin(), b.end());
  in.srcs.insert(in.srcs.end(), c.begin(), c.end());
  for (int i = 0; i < 4; ++i) in.dsts.push_back(reg(Type::f32));
  std::vector<Reg> d = in.dsts;
  emit(std::move(in));
  return d;
}

std::vector<Reg> KernelBuilder::ldmatrix(int count, bool trans, Operand row_address) {
  Instr in;
  in.op = Opc::Ldmatrix;
  in.type = Type::u32;
  in.space = Space::shared;
  in.vec = count;
  in.trans = trans;
  in.srcs = {row_address};
  for (int i = 0; i < count; ++i) in.dsts.push_back(reg(Type::u32));
  std::vector<Reg> d = in.dsts;
  emit(std::move(in));
  return d;
}

void KernelBuilder::cp_async(Operand shared_dst, Operand global_src, int bytes, Operand src_bytes) {
  Instr in;
  in.op = Opc::CpAsync;
  in.type = Type::u32;
  in.space = Space::shared;
  in.vec = bytes;
  in.srcs = {shared_dst, global_src, src_bytes};
  emit(std::move(in));
}

void KernelBuilder::cp_async_commit() { emit_effect(Opc::CpAsyncCommit); }

void KernelBuilder::cp_async_wait(int pending_groups) {
  emit_effect(Opc::CpAsyncWait, {}, Type::u32, Space::global, /*offset=*/pending_groups);
}

void KernelBuilder::wgmma(int n, Operand desc_a, bool a_mn_major, Operand desc_b, bool b_mn_major,
                          const std::vector<Reg>& acc) {
  Instr in;
  in.op = Opc::Wgmma;
  in.type = Type::f32;
  in.space = Space::shared;
  in.vec = n;
  in.trans = a_mn_major;
  in.trans_b = b_mn_major;
  in.srcs = {desc_a, desc_b};
  for (Reg r : acc) in.srcs.emplace_back(r);
  in.dsts = acc;
  emit(std::move(in));
}

void KernelBuilder::wgmma_fence() { emit_effect(Opc::WgmmaFence); }

void KernelBuilder::wgmma_commit() { emit_effect(Opc::WgmmaCommit); }

void KernelBuilder::wgmma_wait(int pending_groups) {
  emit_effect(Opc::WgmmaWait, {}, Type::u32, Space::global, /*offset=*/pending_groups);
}

void KernelBuilder::fence_proxy_async() { emit_effect(Opc::FenceProxyAsync); }

void KernelBuilder::mbarrier_init(Operand barrier, Operand arrivals) {
  emit_effect(Opc::MbarrierInit, {barrier, arrivals}, Type::u64, Space::shared);
}

void KernelBuilder::fence_mbarrier_init() { emit_effect(Opc::FenceMbarrierInit); }

void KernelBuilder::mbarrier_arrive_expect_tx(Operand barrier, Operand bytes) {
  emit_effect(Opc::MbarrierArriveExpectTx, {barrier, bytes}, Type::u64, Space::shared);
}

void KernelBuilder::mbarrier_wait(Operand barrier, Operand parity) {
  emit_effect(Opc::MbarrierWait, {barrier, parity}, Type::u64, Space::shared, k_.num_labels++);  // its loop's label
}

void KernelBuilder::tensor_copy(Operand shared_dst, Operand tensor_map, Operand barrier,
                                const std::vector<Operand>& coords) {
  Instr in;
  in.op = Opc::TensorCopy;
  in.type = Type::u32;
  in.space = Space::shared;
  in.vec = static_cast<int32_t>(coords.size());
  in.srcs = {shared_dst, tensor_map, barrier};
  in.srcs.insert(in.srcs.end(), coords.begin(), coords.end());
  emit(std::move(in));
}

void KernelBuilder::fence_proxy_tensormap(Operand tensor_map) {
  emit_effect(Opc::FenceProxyTensormap, {tensor_map}, Type::u64);
}

Reg KernelBuilder::pack_bf16x2(Operand lo, Operand hi) {
  return emit_op(Opc::PackBf16x2, Type::u32, {lo, hi}, Type::u32);
}

void KernelBuilder::ret() { emit_effect(Opc::Ret); }

void KernelBuilder::membar() { emit_effect(Opc::Membar); }

void KernelBuilder::if_(Reg cond, const std::function<void()>& then_body, const std::function<void()>& else_body) {
  Stmt s;
  s.kind = Stmt::Kind::If;
  s.cond = cond;
  s.label = k_.num_labels++;
  stack_.back()->push_back(std::move(s));
  Stmt& added = stack_.back()->back();
  stack_.push_back(&added.body);
  then_body();
  stack_.pop_back();
  if (else_body) {
    stack_.push_back(&added.else_body);
    else_body();
    stack_.pop_back();
  }
}

void KernelBuilder::if_not(Reg cond, const std::function<void()>& then_body) {
  if_(cond, then_body);
  stack_.back()->back().negate = true;
}

void KernelBuilder::for_(Operand begin, Operand end, Operand step, const std::function<void(Reg)>& body) {
  Stmt s;
  s.kind = Stmt::Kind::For;
  s.var = reg(begin.type);
  s.cond = reg(Type::pred);
  s.begin = begin;
  s.end = end;
  s.step = step;
  s.label = k_.num_labels++;
  Reg var = s.var;
  stack_.back()->push_back(std::move(s));
  stack_.push_back(&stack_.back()->back().body);
  body(var);
  stack_.pop_back();
}

Reg KernelBuilder::global_index_x() {
  Reg c = sreg(SReg::ctaid_x), n = sreg(SReg::ntid_x), t = sreg(SReg::tid_x);
  return mad(Type::u32, c, n, t);
}

Reg KernelBuilder::address(Reg base, Operand index, int bytes) {
  if (index.type != Type::u32 && index.type != Type::u64)
    throw Error("kernel builder: an address index must be u32 or u64, received " + std::string(type_name(index.type)) +
                " in kernel " + k_.name);
  Reg off = index.type == Type::u32 ? mul_wide(Type::u32, index, imm_u32(static_cast<uint32_t>(bytes)))
                                    : mul(Type::u64, index, imm_u64(static_cast<uint64_t>(bytes)));
  return add(Type::u64, base, off);
}

Kernel KernelBuilder::finish() {
  check(k_);
  return std::move(k_);
}

}  // namespace kiln::kir
