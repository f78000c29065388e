// prepare(): flattens a kernel's structured IR (ifs, counted loops, guarded instructions) into
// straight-line simulator ops with branches, resolving every register and immediate to a slot
// of the per-thread register file and every (operation, type) to one interpreter opcode.
#include <map>
#include <utility>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/sim/internal.hpp>

namespace kiln::sim {

using kir::Instr;
using kir::Opc;
using kir::OpcGroup;
using kir::Operand;
using kir::Reg;
using kir::Stmt;
using kir::Type;

namespace {

uint64_t width_mask(Type t) {
  const int bytes = kir::type_bytes(t);
  return t == Type::pred ? 1 : bytes == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * bytes)) - 1;
}

Code setp_code(Code first, kir::Cmp cmp) { return static_cast<Code>(static_cast<int>(first) + static_cast<int>(cmp)); }

class Flattener {
 public:
  Flattener(const kir::Kernel& k, SimKernel& out) : k_(k), out_(out) {
    out_.name = k.name;
    out_.shared_bytes = k.shared_bytes();
    for (const auto& p : k.params) out_.param_types.push_back(p.type);
    // Registers start poisoned (all ones: NaN for floats) so that reading one never written
    // shows; predicates start false.
    for (int t = 0; t < kir::kNumTypes; ++t) {
      base_[t] = static_cast<uint32_t>(out_.init.size());
      const Type type = static_cast<Type>(t);
      out_.init.insert(out_.init.end(), static_cast<size_t>(k.num_regs[t]), type == Type::pred ? 0 : width_mask(type));
    }
  }

  void body(const std::vector<Stmt>& stmts) {
    for (const Stmt& s : stmts) {
      switch (s.kind) {
        case Stmt::Kind::Instr: {
          size_t skip = 0;
          if (s.guard.valid())
            skip =
                branch(s.negate ? Code::BrTrue : Code::BrFalse, s.guard, "the guard of " + kir::describe(k_, s.instr));
          instr(s.instr);
          if (s.guard.valid()) patch(skip);
          break;
        }
        case Stmt::Kind::If: {
          const std::string label = "if " + std::to_string(s.label) + in_kernel();
          const size_t to_else = branch(s.negate ? Code::BrTrue : Code::BrFalse, s.cond, label);
          body(s.body);
          if (s.else_body.empty()) {
            patch(to_else);
          } else {
            const size_t to_end = branch(Code::Bra, {}, "the end of the then-part of " + label);
            patch(to_else);
            body(s.else_body);
            patch(to_end);
          }
          break;
        }
        case Stmt::Kind::For: loop(s); break;
      }
    }
  }

  void finish() { emit(Op{.code = Code::Exit}, "end of kernel" + in_kernel()); }

 private:
  uint32_t reg_slot(Reg r) const { return base_[static_cast<int>(r.type)] + static_cast<uint32_t>(r.index); }

  // Immediates live in slots after the registers, one per distinct (type, value).
  uint32_t slot(const Operand& o) {
    if (!o.is_imm) return reg_slot(o.reg);
    const uint64_t bits = o.type == Type::pred ? (o.bits != 0) : o.bits & width_mask(o.type);
    auto [it, added] = imms_.try_emplace({o.type, bits}, static_cast<uint32_t>(out_.init.size()));
    if (added) out_.init.push_back(bits);
    return it->second;
  }

  size_t emit(const Op& op, std::string text) {
    out_.code.push_back(op);
    out_.text.push_back(std::move(text));
    return out_.code.size() - 1;
  }

  // A branch (target patched later); `pred` is tested by BrTrue/BrFalse.
  size_t branch(Code c, Reg pred, const std::string& what) {
    Op op{.code = c};
    if (pred.valid()) op.a = reg_slot(pred);
    return emit(op, "branch of " + what);
  }
  std::string in_kernel() const { return " (kernel " + k_.name + ")"; }
  void patch(size_t at) { out_.code[at].imm = static_cast<int64_t>(out_.code.size()); }

  // for (var = begin; var < end; var += step): the test at the top, as the PTX printer emits it.
  void loop(const Stmt& s) {
    const std::string what = "for-loop " + std::to_string(s.label) + in_kernel();
    const Type t = s.var.type;
    const bool wide = t == Type::u64 || t == Type::s64;
    const Code lt = t == Type::u32   ? Code::SetpU32
                    : t == Type::s32 ? Code::SetpS32
                    : t == Type::u64 ? Code::SetpU64
                                     : Code::SetpS64;
    emit(Op{.code = Code::Mov, .d = reg_slot(s.var), .a = slot(s.begin)}, "start of " + what);
    const auto top = static_cast<int64_t>(out_.code.size());
    emit(Op{.code = setp_code(lt, kir::Cmp::lt), .d = reg_slot(s.cond), .a = reg_slot(s.var), .b = slot(s.end)},
         "test of " + what);
    const size_t exit = branch(Code::BrFalse, s.cond, what);
    body(s.body);
    emit(Op{.code = wide ? Code::Add64 : Code::Add32, .d = reg_slot(s.var), .a = reg_slot(s.var), .b = slot(s.step)},
         "step of " + what);
    emit(Op{.code = Code::Bra, .imm = top}, "back edge of " + what);
    patch(exit);
  }

  [[noreturn]] void unsupported(const Instr& in) const {
    throw Error("simulator: unsupported instruction (operation and type): " + kir::describe(k_, in));
  }

  // The opcode for an operation by type class; Code::Exit marks "no such combination".
  Code pick(const Instr& in, Code u32, Code s32, Code u64, Code s64, Code f32, Code f64, bool half_ok) const {
    const Code none = Code::Exit;
    Code c = none;
    switch (in.type) {
      case Type::u32: c = u32; break;
      case Type::s32: c = s32; break;
      case Type::u64: c = u64; break;
      case Type::s64: c = s64; break;
      case Type::f32: c = f32; break;
      case Type::f64: c = f64; break;
      case Type::f16:
      case Type::bf16: c = half_ok ? Code::Half : none; break;
      case Type::pred: break;
    }
    if (c == none) unsupported(in);
    return c;
  }

  Code cvt_code(Type from, Type to) const {
    auto is32 = [](Type t) { return t == Type::u32 || t == Type::s32; };
    auto is64 = [](Type t) { return t == Type::u64 || t == Type::s64; };
    // Slots hold values zero-extended, so these conversions copy the slot.
    if (from == to || (is32(from) && is32(to)) || (is64(from) && is64(to)) || (from == Type::u32 && is64(to)))
      return Code::Mov;
    if (from == Type::s32 && is64(to)) return Code::SextS32;
    if (is64(from) && is32(to)) return Code::Trunc32;
    if (from == Type::f32 && to == Type::f64) return Code::CvtF32F64;
    if (from == Type::f64 && to == Type::f32) return Code::CvtF64F32;
    if (from == Type::u32 && to == Type::f32) return Code::CvtU32F32;
    if (from == Type::s32 && to == Type::f32) return Code::CvtS32F32;
    if (from == Type::f32 && to == Type::u32) return Code::CvtF32U32;
    if (from == Type::f32 && to == Type::s32) return Code::CvtF32S32;
    return Code::Cvt;
  }

  // The operand slots every instruction takes (allocated in this order), then its group's opcode.
  void instr(const Instr& in) {
    Op op;
    const Type t = in.type;
    if (in.dsts.size() == 1) op.d = reg_slot(in.dsts[0]);
    if (!in.srcs.empty()) op.a = slot(in.srcs[0]);
    if (in.srcs.size() > 1) op.b = slot(in.srcs[1]);
    if (in.srcs.size() > 2) op.c = slot(in.srcs[2]);
    switch (opc_group(in.op)) {
      case OpcGroup::arith: arith(in, op); break;
      case OpcGroup::memory: memory(in, op); break;
      case OpcGroup::sync: sync(in, op); break;
      case OpcGroup::matrix: matrix(in, op); break;
      case OpcGroup::async_copy: async_copy(in, op); break;
    }
    if (op.code == Code::Half) {
      op.aux = static_cast<uint8_t>(in.op);
      op.size = static_cast<uint8_t>(t);
    }
    emit(op, kir::describe(k_, in));
  }

  // Arithmetic, comparisons, conversions and the f32 approximations (also cvt.rna.tf32, cvt.rn.bf16x2).
  void arith(const Instr& in, Op& op) const {
    const Type t = in.type;
    const Code X = Code::Exit;  // "not available for this type" in pick()
    switch (in.op) {
      case Opc::Mov: op.code = Code::Mov; break;
      case Opc::Add:
        op.code = pick(in, Code::Add32, Code::Add32, Code::Add64, Code::Add64, Code::AddF32, Code::AddF64, true);
        break;
      case Opc::Sub:
        op.code = pick(in, Code::Sub32, Code::Sub32, Code::Sub64, Code::Sub64, Code::SubF32, Code::SubF64, true);
        break;
      case Opc::Mul:
        op.code = pick(in, Code::Mul32, Code::Mul32, Code::Mul64, Code::Mul64, Code::MulF32, Code::MulF64, true);
        break;
      case Opc::MulHi:
        op.code = pick(in, Code::MulHiU32, Code::MulHiS32, Code::MulHiU64, Code::MulHiS64, X, X, false);
        break;
      case Opc::MulWide: op.code = pick(in, Code::MulWideU32, Code::MulWideS32, X, X, X, X, false); break;
      // mad.rn on floats is fused, the same as fma.
      case Opc::Mad:
        op.code = pick(in, Code::Mad32, Code::Mad32, Code::Mad64, Code::Mad64, Code::FmaF32, Code::FmaF64, true);
        break;
      case Opc::Fma: op.code = pick(in, X, X, X, X, Code::FmaF32, Code::FmaF64, true); break;
      case Opc::Div:
        op.code = pick(in, Code::DivU32, Code::DivS32, Code::DivU64, Code::DivS64, Code::DivF32, Code::DivF64, true);
        break;
      case Opc::Rem: op.code = pick(in, Code::RemU32, Code::RemS32, Code::RemU64, Code::RemS64, X, X, false); break;
      case Opc::Min:
        op.code = pick(in, Code::MinU32, Code::MinS32, Code::MinU64, Code::MinS64, Code::MinF32, Code::MinF64, true);
        break;
      case Opc::Max:
        op.code = pick(in, Code::MaxU32, Code::MaxS32, Code::MaxU64, Code::MaxS64, Code::MaxF32, Code::MaxF64, true);
        break;
      case Opc::Neg:
        op.code = pick(in, Code::Neg32, Code::Neg32, Code::Neg64, Code::Neg64, Code::NegF32, Code::NegF64, true);
        break;
      case Opc::Abs:
        op.code = pick(in, Code::Mov, Code::AbsS32, Code::Mov, Code::AbsS64, Code::AbsF32, Code::AbsF64, true);
        break;
      case Opc::And:
      case Opc::Or:
      case Opc::Xor:
        if (kir::is_float_type(t)) unsupported(in);
        op.code = in.op == Opc::And ? Code::And : in.op == Opc::Or ? Code::Or : Code::Xor;
        break;
      case Opc::Not:
        op.code =
            t == Type::pred ? Code::NotPred : pick(in, Code::Not32, Code::Not32, Code::Not64, Code::Not64, X, X, false);
        break;
      case Opc::Shl: op.code = pick(in, Code::Shl32, Code::Shl32, Code::Shl64, Code::Shl64, X, X, false); break;
      case Opc::Shr: op.code = pick(in, Code::ShrU32, Code::ShrS32, Code::ShrU64, Code::ShrS64, X, X, false); break;
      case Opc::Setp:
        if (t == Type::f16 || t == Type::bf16 || t == Type::pred) {
          op.code = Code::SetpGeneric;
          op.aux = static_cast<uint8_t>(in.cmp);
          op.size = static_cast<uint8_t>(t);
        } else {
          op.code = setp_code(
              pick(in, Code::SetpU32, Code::SetpS32, Code::SetpU64, Code::SetpS64, Code::SetpF32, Code::SetpF64, false),
              in.cmp);
        }
        break;
      case Opc::Selp: op.code = Code::Selp; break;
      case Opc::Cvt:
        op.code = cvt_code(in.src_type, t);
        op.aux = static_cast<uint8_t>(in.src_type);
        op.size = static_cast<uint8_t>(t);
        break;
      case Opc::Sqrt: op.code = Code::SqrtF32; break;
      case Opc::RoundTf32: op.code = Code::RoundTf32; break;
      case Opc::PackBf16x2: op.code = Code::PackBf16x2; break;
      case Opc::Ex2:
      case Opc::Lg2:
      case Opc::Rcp:
      case Opc::Rsqrt:
      case Opc::Tanh:
      case Opc::Sin:
      case Opc::Cos:
        op.code = Code::Approx;
        op.aux = static_cast<uint8_t>(in.op);
        break;
      default: throw Error(std::string("simulator: no preparation for ") + kir::opc_name(in.op) + " in its group");
    }
  }

  // Parameters, special registers, shared-array addresses, loads, stores and atomics.
  void memory(const Instr& in, Op& op) {
    const Type t = in.type;
    switch (in.op) {
      case Opc::LdParam:
        op.code = Code::LdParam;
        op.imm = in.param;
        break;
      case Opc::Sreg:
        op.code = Code::Sreg;
        op.aux = static_cast<uint8_t>(in.sreg);
        break;
      case Opc::SharedAddr:
        op.code = Code::Mov;
        op.a = slot(kir::imm_u32(static_cast<uint32_t>(k_.shared_offset(in.shared))));
        break;
      case Opc::Ld:
      case Opc::St: {
        const bool ld = in.op == Opc::Ld, global = in.space == kir::Space::global;
        op.code = ld ? (global ? Code::LdG : Code::LdS) : (global ? Code::StG : Code::StS);
        op.aux = static_cast<uint8_t>(in.vec);
        op.size = static_cast<uint8_t>(kir::type_bytes(t));
        op.imm = in.offset;
        op.b = static_cast<uint32_t>(out_.vslots.size());
        if (ld) {
          for (Reg r : in.dsts) out_.vslots.push_back(reg_slot(r));
        } else {
          for (size_t i = 1; i < in.srcs.size(); ++i) out_.vslots.push_back(slot(in.srcs[i]));
        }
        break;
      }
      case Opc::AtomAdd:
        op.code = in.space == kir::Space::global ? Code::AtomG : Code::AtomS;
        op.aux = t == Type::f32;
        op.size = 4;
        op.imm = in.offset;
        break;
      default: throw Error(std::string("simulator: no preparation for ") + kir::opc_name(in.op) + " in its group");
    }
  }

  // Block barriers, warp shuffles, thread exits and membar.
  void sync(const Instr& in, Op& op) const {
    switch (in.op) {
      case Opc::Bar: op.code = Code::Bar; break;
      case Opc::Shfl:
        op.code = Code::Shfl;
        op.aux = static_cast<uint8_t>(in.shfl);
        break;
      case Opc::Ret: op.code = Code::Exit; break;
      case Opc::Membar: op.code = Code::Fence; break;  // orders global memory (simulator.hpp)
      default: throw Error(std::string("simulator: no preparation for ") + kir::opc_name(in.op) + " in its group");
    }
  }

  // Warp and warpgroup matrix operations (mma.sync, ldmatrix, wgmma) and their fences and groups.
  void matrix(const Instr& in, Op& op) {
    switch (in.op) {
      case Opc::Ldmatrix:
        op.code = Code::Ldmatrix;
        op.aux = static_cast<uint8_t>(in.vec);
        op.size = in.trans ? 1 : 0;
        op.a = slot(in.srcs[0]);
        op.b = static_cast<uint32_t>(out_.vslots.size());
        for (Reg r : in.dsts) out_.vslots.push_back(reg_slot(r));
        break;
      case Opc::Wgmma:
        op.code = Code::Wgmma;
        op.imm = in.vec;
        op.aux = static_cast<uint8_t>((in.trans ? 1 : 0) | (in.trans_b ? 2 : 0));
        op.a = slot(in.srcs[0]);
        op.c = slot(in.srcs[1]);
        op.b = static_cast<uint32_t>(out_.vslots.size());
        for (Reg r : in.dsts) out_.vslots.push_back(reg_slot(r));
        out_.uses_wgmma = true;
        break;
      case Opc::WgmmaFence:
        op.code = Code::WgmmaFence;
        out_.uses_wgmma = true;
        break;
      case Opc::WgmmaCommit:
        op.code = Code::WgmmaCommit;
        out_.uses_wgmma = true;
        break;
      case Opc::WgmmaWait:
        op.code = Code::WgmmaWait;
        op.imm = in.offset;
        out_.uses_wgmma = true;
        break;
      case Opc::FenceProxyAsync:
        op.code = Code::FenceProxyAsync;
        out_.uses_wgmma = true;
        break;
      case Opc::Mma:
        op.code = Code::Mma;
        op.aux = static_cast<uint8_t>(in.mma);
        op.b = static_cast<uint32_t>(out_.vslots.size());
        for (Reg r : in.dsts) out_.vslots.push_back(reg_slot(r));
        for (const auto& s : in.srcs) out_.vslots.push_back(slot(s));
        break;
      default: throw Error(std::string("simulator: no preparation for ") + kir::opc_name(in.op) + " in its group");
    }
  }

  // Asynchronous copies: cp.async, mbarriers and tensor-map copies.
  void async_copy(const Instr& in, Op& op) {
    switch (in.op) {
      case Opc::CpAsync:
        op.code = Code::CpAsync;
        op.size = static_cast<uint8_t>(in.vec);
        op.a = slot(in.srcs[0]);
        op.b = slot(in.srcs[1]);
        op.c = slot(in.srcs[2]);
        break;
      case Opc::CpAsyncCommit: op.code = Code::CpAsyncCommit; break;
      case Opc::CpAsyncWait:
        op.code = Code::CpAsyncWait;
        op.imm = in.offset;
        break;
      case Opc::MbarrierInit:
      case Opc::MbarrierArriveExpectTx:
      case Opc::MbarrierWait:
        op.code = in.op == Opc::MbarrierInit             ? Code::MbarrierInit
                  : in.op == Opc::MbarrierArriveExpectTx ? Code::MbarrierArriveExpectTx
                                                         : Code::MbarrierWait;
        op.a = slot(in.srcs[0]);
        op.b = slot(in.srcs[1]);
        out_.uses_mbarriers = true;
        break;
      case Opc::FenceMbarrierInit:
        op.code = Code::FenceMbarrierInit;
        out_.uses_mbarriers = true;
        break;
      case Opc::FenceProxyTensormap:
        op.code = Code::FenceProxyTensormap;
        op.a = slot(in.srcs[0]);
        out_.uses_mbarriers = true;
        break;
      case Opc::TensorCopy:
        op.code = Code::TensorCopy;
        op.a = slot(in.srcs[0]);
        op.b = slot(in.srcs[1]);
        op.c = slot(in.srcs[2]);
        op.aux = static_cast<uint8_t>(in.vec);
        op.imm = static_cast<int64_t>(out_.vslots.size());
        for (size_t i = 3; i < in.srcs.size(); ++i) out_.vslots.push_back(slot(in.srcs[i]));
        out_.uses_mbarriers = true;
        break;
      default: throw Error(std::string("simulator: no preparation for ") + kir::opc_name(in.op) + " in its group");
    }
  }

  const kir::Kernel& k_;
  SimKernel& out_;
  uint32_t base_[kir::kNumTypes] = {};
  std::map<std::pair<Type, uint64_t>, uint32_t> imms_;
};

}  // namespace

std::shared_ptr<const SimKernel> prepare(const kir::Kernel& k) {
  kir::check(k);
  auto out = std::make_shared<SimKernel>();
  Flattener f(k, *out);
  f.body(k.body);
  f.finish();
  return out;
}

}  // namespace kiln::sim
