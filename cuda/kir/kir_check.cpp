// Kernel IR: the structural checker (check()) that the builder runs on finish(), and the
// sm_90a test (needs_sm90a()) that sets the shared-memory limit it enforces.
#include <algorithm>
#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/kir/kir.hpp>

namespace kiln::kir {

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
  // The instruction has exactly n operands; it has one destination, of type t.
  void nsrc(const Instr& in, size_t n) const {
    if (in.srcs.size() != n) fail(in, "expected " + std::to_string(n) + " operands");
  }
  void dst_is(const Instr& in, Type t) const {
    if (in.dsts.size() != 1 || in.dsts[0].type != t) fail(in, std::string("destination must be ") + type_name(t));
  }
  // Every register an instruction names is allocated; then the checks of its group.
  void instr(const Instr& in) {
    for (Reg r : in.dsts) reg_ok(in, r);
    for (const auto& o : in.srcs)
      if (!o.is_imm) reg_ok(in, o.reg);
    switch (opc_group(in.op)) {
      case OpcGroup::arith: arith(in); break;
      case OpcGroup::memory: memory(in); break;
      case OpcGroup::sync: sync(in); break;
      case OpcGroup::matrix: matrix(in); break;
      case OpcGroup::async_copy: async_copy(in); break;
    }
  }
  // Arithmetic, comparisons, conversions and the f32 approximations (also cvt.rna.tf32, cvt.rn.bf16x2).
  void arith(const Instr& in) const {
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
        nsrc(in, 2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        dst_is(in, in.type);
        if ((in.op == Opc::Rem || in.op == Opc::MulHi || in.op == Opc::And || in.op == Opc::Or || in.op == Opc::Xor) &&
            is_float_type(in.type))
          fail(in, "integer operation on a float type");
        break;
      case Opc::Shl:
      case Opc::Shr:
        nsrc(in, 2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], Type::u32, "shift");
        dst_is(in, in.type);
        break;
      case Opc::MulWide: {
        nsrc(in, 2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        if (in.type != Type::u32 && in.type != Type::s32) fail(in, "mul.wide takes u32 or s32");
        dst_is(in, in.type == Type::u32 ? Type::u64 : Type::s64);
        break;
      }
      case Opc::Mad:
      case Opc::Fma:
        nsrc(in, 3);
        for (const auto& o : in.srcs) type_is(in, o, in.type, "operand");
        dst_is(in, in.type);
        if (in.op == Opc::Fma && !is_float_type(in.type)) fail(in, "fma needs a float type");
        break;
      case Opc::Mov:
      case Opc::Neg:
      case Opc::Abs:
      case Opc::Not:
        nsrc(in, 1);
        type_is(in, in.srcs[0], in.type, "a");
        dst_is(in, in.type);
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
        nsrc(in, 1);
        if (in.type != Type::f32) fail(in, "approximate functions are f32 only");
        type_is(in, in.srcs[0], Type::f32, "a");
        dst_is(in, Type::f32);
        break;
      case Opc::Setp:
        nsrc(in, 2);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        dst_is(in, Type::pred);
        break;
      case Opc::Selp:
        nsrc(in, 3);
        type_is(in, in.srcs[0], in.type, "a");
        type_is(in, in.srcs[1], in.type, "b");
        type_is(in, in.srcs[2], Type::pred, "condition");
        dst_is(in, in.type);
        break;
      case Opc::Cvt:
        nsrc(in, 1);
        type_is(in, in.srcs[0], in.src_type, "a");
        dst_is(in, in.type);
        break;
      case Opc::PackBf16x2:
        nsrc(in, 2);
        if (in.type != Type::u32) fail(in, "cvt.rn.bf16x2 packs into a u32");
        type_is(in, in.srcs[0], Type::f32, "low half");
        type_is(in, in.srcs[1], Type::f32, "high half");
        dst_is(in, Type::u32);
        break;
      default: fail(in, "no check for this opcode in its group (kir::opc_info)");
    }
  }
  // Parameters, special registers, shared-array addresses, loads, stores and atomics.
  void memory(const Instr& in) const {
    switch (in.op) {
      case Opc::LdParam:
        nsrc(in, 0);
        if (in.param < 0 || in.param >= static_cast<int>(k.params.size())) fail(in, "no such parameter");
        dst_is(in, k.params[static_cast<size_t>(in.param)].type);
        break;
      case Opc::Sreg:
        nsrc(in, 0);
        dst_is(in, Type::u32);
        break;
      case Opc::SharedAddr:
        nsrc(in, 0);
        if (in.shared < 0 || in.shared >= static_cast<int>(k.shared.size())) fail(in, "no such shared array");
        dst_is(in, Type::u32);
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
          nsrc(in, 1);
          if (static_cast<int>(in.dsts.size()) != in.vec) fail(in, "one destination per vector element");
          for (Reg r : in.dsts)
            if (r.type != in.type) fail(in, "destination type");
        } else if (in.op == Opc::St) {
          nsrc(in, 1 + static_cast<size_t>(in.vec));
          for (size_t i = 1; i < in.srcs.size(); ++i) type_is(in, in.srcs[i], in.type, "stored value");
        } else {
          nsrc(in, 2);
          if (in.type != Type::f32 && in.type != Type::u32) fail(in, "atomic add takes f32 or u32");
          type_is(in, in.srcs[1], in.type, "added value");
          dst_is(in, in.type);
        }
        break;
      }
      default: fail(in, "no check for this opcode in its group (kir::opc_info)");
    }
  }
  // Block barriers, warp shuffles, thread exits (which set exit_seen) and membar.
  void sync(const Instr& in) {
    switch (in.op) {
      case Opc::Bar:
        if (exit_seen) fail(in, "a thread may have exited before this bar.sync (guard the work with an if instead)");
        break;
      case Opc::Shfl:
        nsrc(in, 3);
        if (in.type != Type::u32 && in.type != Type::f32 && in.type != Type::s32) fail(in, "shfl moves 32-bit values");
        type_is(in, in.srcs[0], in.type, "value");
        type_is(in, in.srcs[1], Type::u32, "lane");
        type_is(in, in.srcs[2], Type::u32, "clamp");
        dst_is(in, in.type);
        if (exit_seen)
          fail(in, "a thread may have exited before this full-mask shfl.sync (guard the work with an if instead)");
        break;
      case Opc::Ret: exit_seen = true; break;
      case Opc::Membar: break;
      default: fail(in, "no check for this opcode in its group (kir::opc_info)");
    }
  }
  // Warp and warpgroup matrix operations (mma.sync, ldmatrix, wgmma) and their fences and groups.
  void matrix(const Instr& in) const {
    switch (in.op) {
      case Opc::Mma: {
        nsrc(in, 10);
        if (in.dsts.size() != 4) fail(in, "mma writes 4 f32 accumulators");
        for (Reg r : in.dsts)
          if (r.type != Type::f32) fail(in, "mma's accumulators are f32");
        const Type ab = in.mma == MmaShape::m16n8k8_tf32 ? Type::f32 : Type::u32;
        for (size_t i = 0; i < 6; ++i) type_is(in, in.srcs[i], ab, i < 4 ? "A fragment" : "B fragment");
        for (size_t i = 6; i < 10; ++i) type_is(in, in.srcs[i], Type::f32, "C fragment");
        if (exit_seen) fail(in, "a thread may have exited before this mma.sync (guard the work with an if instead)");
        break;
      }
      case Opc::Ldmatrix: {
        nsrc(in, 1);
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
        nsrc(in, 2 + n_acc);
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
      case Opc::FenceProxyAsync: nsrc(in, 0); break;
      case Opc::WgmmaWait:
        nsrc(in, 0);
        if (in.offset < 0 || in.offset > 7) fail(in, "wgmma.wait_group takes 0 to 7 pending groups");
        if (exit_seen)
          fail(in, "a thread may have exited before this wgmma.wait_group (guard the work with an if instead)");
        break;
      default: fail(in, "no check for this opcode in its group (kir::opc_info)");
    }
  }
  // Asynchronous copies: cp.async, mbarriers and tensor-map copies.
  void async_copy(const Instr& in) const {
    switch (in.op) {
      case Opc::CpAsync:
        nsrc(in, 3);
        if (in.vec != 4 && in.vec != 8 && in.vec != 16) fail(in, "cp.async copies 4, 8 or 16 bytes");
        type_is(in, in.srcs[0], Type::u32, "shared destination");
        type_is(in, in.srcs[1], Type::u64, "global source");
        type_is(in, in.srcs[2], Type::u32, "source bytes");
        if (!in.dsts.empty()) fail(in, "cp.async writes no register");
        break;
      case Opc::CpAsyncCommit: nsrc(in, 0); break;
      case Opc::CpAsyncWait:
        nsrc(in, 0);
        if (in.offset < 0 || in.offset > 7) fail(in, "cp.async.wait_group takes 0 to 7 pending groups");
        break;
      case Opc::MbarrierInit:
      case Opc::MbarrierArriveExpectTx:
      case Opc::MbarrierWait:
        nsrc(in, 2);
        type_is(in, in.srcs[0], Type::u32, "barrier address (shared)");
        type_is(in, in.srcs[1], Type::u32,
                in.op == Opc::MbarrierInit   ? "arrival count"
                : in.op == Opc::MbarrierWait ? "phase parity"
                                             : "expected bytes");
        if (!in.dsts.empty()) fail(in, "mbarrier operations here write no register");
        break;
      case Opc::FenceMbarrierInit: nsrc(in, 0); break;
      case Opc::FenceProxyTensormap:
        nsrc(in, 1);
        type_is(in, in.srcs[0], Type::u64, "tensor map address");
        break;
      case Opc::TensorCopy:
        if (in.vec < 1 || in.vec > 5) fail(in, "a tensor copy has 1 to 5 coordinates");
        nsrc(in, 3 + static_cast<size_t>(in.vec));
        type_is(in, in.srcs[0], Type::u32, "shared destination");
        type_is(in, in.srcs[1], Type::u64, "tensor map address");
        type_is(in, in.srcs[2], Type::u32, "barrier address (shared)");
        for (size_t i = 3; i < in.srcs.size(); ++i) type_is(in, in.srcs[i], Type::s32, "coordinate");
        if (!in.dsts.empty()) fail(in, "a tensor copy writes no register");
        break;
      default: fail(in, "no check for this opcode in its group (kir::opc_info)");
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

namespace {

// The largest of f over the kernel's instructions (0 for none), inside ifs and loops too.
template <class F>
int max_over_instrs(const std::vector<Stmt>& stmts, const F& f) {
  int m = 0;
  for (const Stmt& s : stmts)
    m = std::max(
        {m, s.kind == Stmt::Kind::Instr ? f(s.instr) : 0, max_over_instrs(s.body, f), max_over_instrs(s.else_body, f)});
  return m;
}

}  // namespace

bool needs_sm90a(const Kernel& k) {
  return max_over_instrs(k.body, [](const Instr& in) { return opc_info(in.op).sm90a ? 1 : 0; }) > 0;
}

int min_ptx_version(const Kernel& k) {
  return max_over_instrs(k.body, [](const Instr& in) { return opc_info(in.op).min_ptx; });
}

int64_t max_shared_bytes(const Kernel& k) { return needs_sm90a(k) ? kMaxSharedBytesSm90a : kMaxSharedBytes; }

void check(const Kernel& k) {
  if (k.shared_bytes() > max_shared_bytes(k))
    throw Error("kernel '" + k.name + "': " + std::to_string(k.shared_bytes()) + " bytes of shared memory, over the " +
                std::to_string(max_shared_bytes(k)) + " a kernel may take");
  Checker c{k};
  c.body(k.body);
}

}  // namespace kiln::kir
