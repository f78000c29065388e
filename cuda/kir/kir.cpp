// Kernel IR: type helpers, the builder and the structural checker.
#include <bit>
#include <cstring>

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

const char* opc_name(Opc op) {
  // clang-format off
  static const char* kNames[] = {
      "mov",         "add", "sub", "mul",      "mul.hi",   "mul.wide",  "mad",  "fma",      "div", "rem",      "min",
      "max",         "neg", "abs", "and",      "or",       "xor",       "not",  "shl",      "shr", "setp",     "selp",
      "cvt",         "ex2", "lg2", "rcp",      "rsqrt",    "sqrt",      "tanh", "sin",      "cos", "ld.param", "sreg",
      "shared.addr", "ld",  "st",  "atom.add", "bar.sync", "shfl.sync", "ret",  "membar.gl",
      "mma.sync", "cvt.rna.tf32", "ldmatrix", "cp.async", "cp.async.commit_group", "cp.async.wait_group",
      "cvt.rn.bf16x2", "wgmma.mma_async", "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group",
      "fence.proxy.async", "mbarrier.init", "fence.mbarrier_init", "mbarrier.arrive.expect_tx",
      "mbarrier.try_wait.parity", "cp.async.bulk.tensor", "fence.proxy.tensormap"};
  // clang-format on
  return kNames[static_cast<int>(op)];
}

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
// Checker

namespace {

struct Checker {
  const Kernel& k;
  bool exit_seen = false;  // a Ret that some thread may have executed earlier in program order

  [[noreturn]] void fail(const Instr& in, const std::string& why) const {
    throw Error("kernel IR check: " + why + ": " + describe(k, in));
  }
  void reg_ok(const Instr& in, Reg r) const {
    if (r.index < 0 || r.index >= k.num_regs[static_cast<int>(r.type)]) fail(in, "unallocated register");
  }
  void type_is(const Instr& in, const Operand& o, Type t, const char* what) const {
    if (o.type != t) fail(in, std::string(what) + " has type " + type_name(o.type) + ", expected " + type_name(t));
  }
  void instr(const Instr& in) {
    for (Reg r : in.dsts) reg_ok(in, r);
    for (const auto& o : in.srcs)
      if (!o.is_imm) reg_ok(in, o.reg);
    auto nsrc = [&](size_t n) {
      if (in.srcs.size() != n) fail(in, "expected " + std::to_string(n) + " operands");
    };
    auto dst_is = [&](Type t) {
      if (in.dsts.size() != 1 || in.dsts[0].type != t) fail(in, std::string("destination must be ") + type_name(t));
    };
    switch (in.op) {
      case Opc::Add:
      case Opc::Sub:
      case Opc::Mul:
      case Opc::MulHi:
      case Opc::Div:
      case Opc::Rem:
      case Opc::Min:
      case Opc::Max:
      case Opc::And:
      case Opc::Or:
      case Opc::Xor:
        nsrc(2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        dst_is(in.type);
        if ((in.op == Opc::Rem || in.op == Opc::MulHi || in.op == Opc::And || in.op == Opc::Or || in.op == Opc::Xor) &&
            is_float_type(in.type))
          fail(in, "integer operation on a float type");
        break;
      case Opc::Shl:
      case Opc::Shr:
        nsrc(2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], Type::u32, "shift");
        dst_is(in.type);
        break;
      case Opc::MulWide: {
        nsrc(2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        if (in.type != Type::u32 && in.type != Type::s32) fail(in, "mul.wide takes u32 or s32");
        dst_is(in.type == Type::u32 ? Type::u64 : Type::s64);
        break;
      }
      case Opc::Mad:
      case Opc::Fma:
        nsrc(3);
        for (const auto& o : in.srcs) type_is(in, o, in.type, "operand");
        dst_is(in.type);
        if (in.op == Opc::Fma && !is_float_type(in.type)) fail(in, "fma needs a float type");
        break;
      case Opc::Mov:
      case Opc::Neg:
      case Opc::Abs:
      case Opc::Not:
        nsrc(1);
        type_is(in, in.srcs[0], in.type, "a");
        dst_is(in.type);
        break;
      case Opc::RoundTf32:
      case Opc::Ex2:
      case Opc::Lg2:
      case Opc::Rcp:
      case Opc::Rsqrt:
      case Opc::Sqrt:
      case Opc::Tanh:
      case Opc::Sin:
      case Opc::Cos:
        nsrc(1);
        if (in.type != Type::f32) fail(in, "approximate functions are f32 only");
        type_is(in, in.srcs[0], Type::f32, "a");
        dst_is(Type::f32);
        break;
      case Opc::Setp:
        nsrc(2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        dst_is(Type::pred);
        break;
      case Opc::Selp:
        nsrc(3);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        type_is(in, in.srcs[2], Type::pred, "condition");
        dst_is(in.type);
        break;
      case Opc::Cvt:
        nsrc(1);
        type_is(in, in.srcs[0], in.src_type, "a");
        dst_is(in.type);
        break;
      case Opc::LdParam:
        nsrc(0);
        if (in.param < 0 || in.param >= static_cast<int>(k.params.size())) fail(in, "no such parameter");
        dst_is(k.params[static_cast<size_t>(in.param)].type);
        break;
      case Opc::Sreg:
        nsrc(0);
        dst_is(Type::u32);
        break;
      case Opc::SharedAddr:
        nsrc(0);
        if (in.shared < 0 || in.shared >= static_cast<int>(k.shared.size())) fail(in, "no such shared array");
        dst_is(Type::u32);
        break;
      case Opc::Ld:
      case Opc::St:
      case Opc::AtomAdd: {
        Type at = in.space == Space::global ? Type::u64 : Type::u32;
        if (in.srcs.empty()) fail(in, "missing address");
        type_is(in, in.srcs[0], at, "address");
        if (in.vec != 1 && in.vec != 2 && in.vec != 4) fail(in, "vector width must be 1, 2 or 4");
        if (in.vec * type_bytes(in.type) > 16) fail(in, "vector access wider than 16 bytes");
        if (in.op == Opc::Ld) {
          nsrc(1);
          if (static_cast<int>(in.dsts.size()) != in.vec) fail(in, "one destination per vector element");
          for (Reg r : in.dsts)
            if (r.type != in.type) fail(in, "destination type");
        } else if (in.op == Opc::St) {
          nsrc(1 + static_cast<size_t>(in.vec));
          for (size_t i = 1; i < in.srcs.size(); ++i) type_is(in, in.srcs[i], in.type, "stored value");
        } else {
          nsrc(2);
          if (in.type != Type::f32 && in.type != Type::u32) fail(in, "atomic add takes f32 or u32");
          type_is(in, in.srcs[1], in.type, "added value");
          dst_is(in.type);
        }
        break;
      }
      case Opc::Bar:
        if (exit_seen) fail(in, "a thread may have exited before this bar.sync (guard the work with an if instead)");
        break;
      case Opc::Shfl:
        nsrc(3);
        if (in.type != Type::u32 && in.type != Type::f32 && in.type != Type::s32) fail(in, "shfl moves 32-bit values");
        type_is(in, in.srcs[0], in.type, "value");
        type_is(in, in.srcs[1], Type::u32, "lane");
        type_is(in, in.srcs[2], Type::u32, "clamp");
        dst_is(in.type);
        if (exit_seen)
          fail(in, "a thread may have exited before this full-mask shfl.sync (guard the work with an if instead)");
        break;
      case Opc::Ret: exit_seen = true; break;
      case Opc::Membar: break;
      case Opc::Mma: {
        nsrc(10);
        if (in.dsts.size() != 4) fail(in, "mma writes 4 f32 accumulators");
        for (Reg r : in.dsts)
          if (r.type != Type::f32) fail(in, "mma's accumulators are f32");
        const Type ab = in.mma == MmaShape::m16n8k8_tf32 ? Type::f32 : Type::u32;
        for (size_t i = 0; i < 6; ++i) type_is(in, in.srcs[i], ab, i < 4 ? "A fragment" : "B fragment");
        for (size_t i = 6; i < 10; ++i) type_is(in, in.srcs[i], Type::f32, "C fragment");
        if (exit_seen) fail(in, "a thread may have exited before this mma.sync (guard the work with an if instead)");
        break;
      }
      case Opc::CpAsync:
        nsrc(3);
        if (in.vec != 4 && in.vec != 8 && in.vec != 16) fail(in, "cp.async copies 4, 8 or 16 bytes");
        type_is(in, in.srcs[0], Type::u32, "shared destination");
        type_is(in, in.srcs[1], Type::u64, "global source");
        type_is(in, in.srcs[2], Type::u32, "source bytes");
        if (!in.dsts.empty()) fail(in, "cp.async writes no register");
        break;
      case Opc::CpAsyncCommit: nsrc(0); break;
      case Opc::CpAsyncWait:
        nsrc(0);
        if (in.offset < 0 || in.offset > 7) fail(in, "cp.async.wait_group takes 0 to 7 pending groups");
        break;
      case Opc::Ldmatrix: {
        nsrc(1);
        if (in.vec != 1 && in.vec != 2 && in.vec != 4) fail(in, "ldmatrix loads 1, 2 or 4 matrices");
        if (in.dsts.size() != static_cast<size_t>(in.vec)) fail(in, "ldmatrix writes one u32 a matrix");
        for (Reg r : in.dsts)
          if (r.type != Type::u32) fail(in, "ldmatrix's destinations are u32 (two 16-bit elements each)");
        type_is(in, in.srcs[0], Type::u32, "row address (shared)");
        if (exit_seen) fail(in, "a thread may have exited before this ldmatrix (guard the work with an if instead)");
        break;
      }
      case Opc::Wgmma: {
        if (in.vec < 8 || in.vec > 256 || in.vec % 8 != 0) fail(in, "wgmma's n is a multiple of 8 up to 256");
        const auto n_acc = static_cast<size_t>(in.vec / 2);
        nsrc(2 + n_acc);
        type_is(in, in.srcs[0], Type::u64, "A descriptor");
        type_is(in, in.srcs[1], Type::u64, "B descriptor");
        if (in.dsts.size() != n_acc) fail(in, "wgmma writes n / 2 f32 accumulators");
        for (size_t i = 0; i < n_acc; ++i) {
          if (in.dsts[i].type != Type::f32) fail(in, "wgmma's accumulators are f32");
          if (in.srcs[2 + i].is_imm || !(in.srcs[2 + i].reg == in.dsts[i]))
            fail(in, "wgmma reads its accumulators in place: C must be the registers of D");
        }
        if (exit_seen) fail(in, "a thread may have exited before this wgmma (guard the work with an if instead)");
        break;
      }
      case Opc::WgmmaFence:
      case Opc::WgmmaCommit:
      case Opc::FenceProxyAsync: nsrc(0); break;
      case Opc::WgmmaWait:
        nsrc(0);
        if (in.offset < 0 || in.offset > 7) fail(in, "wgmma.wait_group takes 0 to 7 pending groups");
        if (exit_seen)
          fail(in, "a thread may have exited before this wgmma.wait_group (guard the work with an if instead)");
        break;
      case Opc::MbarrierInit:
      case Opc::MbarrierArriveExpectTx:
      case Opc::MbarrierWait:
        nsrc(2);
        type_is(in, in.srcs[0], Type::u32, "barrier address (shared)");
        type_is(in, in.srcs[1], Type::u32,
                in.op == Opc::MbarrierInit   ? "arrival count"
                : in.op == Opc::MbarrierWait ? "phase parity"
                                             : "expected bytes");
        if (!in.dsts.empty()) fail(in, "mbarrier operations here write no register");
        break;
      case Opc::FenceMbarrierInit: nsrc(0); break;
      case Opc::FenceProxyTensormap:
        nsrc(1);
        type_is(in, in.srcs[0], Type::u64, "tensor map address");
        break;
      case Opc::TensorCopy:
        if (in.vec < 1 || in.vec > 5) fail(in, "a tensor copy has 1 to 5 coordinates");
        nsrc(3 + static_cast<size_t>(in.vec));
        type_is(in, in.srcs[0], Type::u32, "shared destination");
        type_is(in, in.srcs[1], Type::u64, "tensor map address");
        type_is(in, in.srcs[2], Type::u32, "barrier address (shared)");
        for (size_t i = 3; i < in.srcs.size(); ++i) type_is(in, in.srcs[i], Type::s32, "coordinate");
        if (!in.dsts.empty()) fail(in, "a tensor copy writes no register");
        break;
      case Opc::PackBf16x2:
        nsrc(2);
        if (in.type != Type::u32) fail(in, "cvt.rn.bf16x2 packs into a u32");
        type_is(in, in.srcs[0], Type::f32, "low half");
        type_is(in, in.srcs[1], Type::f32, "high half");
        dst_is(Type::u32);
        break;
    }
  }
  void body(const std::vector<Stmt>& stmts) {
    for (const auto& s : stmts) {
      switch (s.kind) {
        case Stmt::Kind::Instr:
          if (s.guard.valid() && s.guard.type != Type::pred) fail(s.instr, "guard must be a predicate");
          if (s.guard.valid() &&
              (s.instr.op == Opc::Mma || s.instr.op == Opc::RoundTf32 || s.instr.op == Opc::PackBf16x2))
            fail(s.instr, "mma.sync, cvt.rna.tf32 and cvt.rn.bf16x2 are printed as blocks: no guard (use an if)");
          if (s.guard.valid() && s.instr.op == Opc::Ldmatrix) fail(s.instr, "ldmatrix needs the whole warp: no guard");
          if (s.guard.valid() && s.instr.op == Opc::MbarrierWait)
            fail(s.instr, "an mbarrier wait is printed as a loop: no guard (use an if)");
          if (s.guard.valid() && (s.instr.op == Opc::Wgmma || s.instr.op == Opc::WgmmaFence ||
                                  s.instr.op == Opc::WgmmaCommit || s.instr.op == Opc::WgmmaWait))
            fail(s.instr, "wgmma and its fence and group operations need the whole warpgroup: no guard");
          instr(s.instr);
          break;
        case Stmt::Kind::If:
          if (s.cond.type != Type::pred || !s.cond.valid())
            throw Error("kernel IR check: if without a predicate in " + k.name);
          body(s.body);
          body(s.else_body);
          break;
        case Stmt::Kind::For:
          if (s.var.type != s.begin.type || s.var.type != s.end.type || s.var.type != s.step.type)
            throw Error("kernel IR check: for-loop bounds and variable differ in type in " + k.name);
          // A loop body runs again after its own later instructions: an exit anywhere in it
          // precedes every barrier in it.
          {
            bool before = exit_seen;
            body(s.body);
            if (exit_seen && !before) body(s.body);
          }
          break;
      }
    }
  }
};

}  // namespace

bool needs_sm90a(const Kernel& k) {
  std::function<bool(const std::vector<Stmt>&)> any = [&](const std::vector<Stmt>& stmts) {
    for (const Stmt& s : stmts) {
      if (s.kind == Stmt::Kind::Instr) {
        const Opc op = s.instr.op;
        if (op == Opc::Wgmma || op == Opc::WgmmaFence || op == Opc::WgmmaCommit || op == Opc::WgmmaWait ||
            op == Opc::FenceProxyAsync || op == Opc::MbarrierInit || op == Opc::FenceMbarrierInit ||
            op == Opc::MbarrierArriveExpectTx || op == Opc::MbarrierWait || op == Opc::TensorCopy ||
            op == Opc::FenceProxyTensormap)
          return true;
      } else if (any(s.body) || any(s.else_body)) {
        return true;
      }
    }
    return false;
  };
  return any(k.body);
}

int64_t max_shared_bytes(const Kernel& k) { return needs_sm90a(k) ? kMaxSharedBytesSm90a : kMaxSharedBytes; }

void check(const Kernel& k) {
  if (k.shared_bytes() > max_shared_bytes(k))
    throw Error("kernel '" + k.name + "': " + std::to_string(k.shared_bytes()) + " bytes of shared memory, over the " +
                std::to_string(max_shared_bytes(k)) + " a kernel may take");
  Checker c{k};
  c.body(k.body);
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
