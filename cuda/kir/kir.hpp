// Kernel IR: the typed, imperative IR that every Prim lowers to. It prints one-to-one as PTX
// (cuda/kir/ptx_printer.hpp) and runs in the SIMT simulator (cuda/sim/simulator.hpp). Registers are
// typed virtual registers numbered per type; control flow is structured (if/else, counted
// for-loops); memory is global (64-bit addresses) or shared (32-bit offsets into the block's
// shared window). The KernelBuilder below is how lowerings write kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kiln::kir {

enum class Type : uint8_t { pred, u32, s32, u64, s64, f32, f64, f16, bf16 };
constexpr int kNumTypes = 9;

const char* type_name(Type t);  // PTX spelling: "pred", "u32", "f32", ...
int type_bytes(Type t);         // pred: 1 (never stored)
bool is_float_type(Type t);     // f32, f64, f16, bf16
bool is_signed_type(Type t);    // s32, s64

// A virtual register: its type and its number among the kernel's registers of that type.
struct Reg {
  Type type = Type::u32;
  int32_t index = -1;
  bool valid() const { return index >= 0; }
  bool operator==(const Reg& o) const { return type == o.type && index == o.index; }
};

// A register or an immediate. Immediates keep the exact bit pattern of their value in `type`
// (floats print as 0f/0d hex, so the text is exact and deterministic).
struct Operand {
  bool is_imm = false;
  Reg reg;
  Type type = Type::u32;
  uint64_t bits = 0;
  Operand() = default;
  Operand(Reg r) : reg(r), type(r.type) {}  // NOLINT: registers are operands
  static Operand imm(Type t, uint64_t bits);
};
Operand imm_u32(uint32_t v);
Operand imm_s32(int32_t v);
Operand imm_u64(uint64_t v);
Operand imm_s64(int64_t v);
Operand imm_f32(float v);
Operand imm_f64(double v);

enum class SReg : uint8_t {
  tid_x,
  tid_y,
  tid_z,
  ntid_x,
  ntid_y,
  ntid_z,
  ctaid_x,
  ctaid_y,
  ctaid_z,
  nctaid_x,
  nctaid_y,
  nctaid_z,
  laneid
};
const char* sreg_name(SReg s);  // "%tid.x", ...

enum class Cmp : uint8_t { eq, ne, lt, le, gt, ge };
enum class ShflMode : uint8_t { down, up, bfly, idx };  // bfly is PTX's name for xor
// The warp-level matrix products of Opc::Mma, with f32 accumulators (C and D: 4 f32 a lane):
//  m16n8k8_tf32:  A 16x8, B 8x8 of tf32 (f32 registers, 4 and 2 a lane; the low 13 mantissa
//                 bits are not read: round with cvt.rna.tf32 first where that matters);
//  m16n8k16_bf16, m16n8k16_f16: A 16x16, B 16x8, two 16-bit values packed in each u32 register
//                 (4 and 2 a lane; the lower-numbered element in the low half).
enum class MmaShape : uint8_t { m16n8k8_tf32, m16n8k16_bf16, m16n8k16_f16 };
const char* mma_shape_name(MmaShape s);  // "m16n8k8.row.col.f32.tf32.tf32.f32", ...
enum class Space : uint8_t { global, shared };

// A launch's grid or block: counts of blocks or threads along x, y and z.
struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
  uint64_t count() const { return uint64_t{x} * y * z; }
};

// Opcodes. Types: `type` is the operation type (PTX's instruction type suffix).
enum class Opc : uint8_t {
  Mov,      // dst = a                        (also: Reg = shared array address, see SharedAddr)
  Add,      // dst = a + b
  Sub,      // dst = a - b
  Mul,      // dst = a * b (integers: low half, mul.lo)
  MulHi,    // dst = high half of a * b (integers)
  MulWide,  // dst (2x wide) = a * b, type is the source type (u32 -> u64, s32 -> s64)
  Mad,      // dst = a * b + c (integers: mad.lo)
  Fma,      // dst = fma(a, b, c), round to nearest (floats)
  Div,      // dst = a / b (floats: div.rn; integers truncate)
  Rem,      // dst = a % b (integers, C semantics)
  Min,
  Max,
  Neg,
  Abs,
  And,
  Or,
  Xor,
  Not,
  Shl,   // dst = a << b (b: u32)
  Shr,   // dst = a >> b (b: u32; arithmetic for signed types)
  Setp,  // dst (pred) = a cmp b; floats compare ordered (false when either is NaN), except ne: unordered
  Selp,  // dst = c ? a : b (c: pred)
  Cvt,   // dst (type) = a (src_type); float -> int rounds toward zero (rzi), int -> float and
         // narrowing float conversions round to nearest (rn)
  // Fast approximations (f32 only), with the accuracy the PTX ISA documents; the simulator
  // evaluates them within that error:
  Ex2,         // 2^a          ex2.approx.ftz.f32: max relative error 2^-22.5 (2 ulp)
  Lg2,         // log2(a)      lg2.approx.ftz.f32: max absolute error 2^-22.6 (relative 2^-22 away from 1)
  Rcp,         // 1/a          rcp.approx.ftz.f32: max relative error 1 ulp
  Rsqrt,       // 1/sqrt(a)    rsqrt.approx.ftz.f32: max relative error 2^-22.9
  Sqrt,        // sqrt(a)      sqrt.rn.f32: IEEE rounded (exact)
  Tanh,        // tanh(a)      tanh.approx.f32 (sm_75+): max relative error 2^-10.987
  Sin,         // sin(a)       sin.approx.ftz.f32: max absolute error 2^-20.5 on [-pi, pi]
  Cos,         // cos(a)       cos.approx.ftz.f32: max absolute error 2^-20.5 on [-pi, pi]
  LdParam,     // dst = kernel parameter number `param`
  Sreg,        // dst (u32) = special register `sreg`
  SharedAddr,  // dst (u32) = offset of shared array number `shared` in the block's shared window
  Ld,          // dsts[0..vec) = space[a + offset]   (vec 1, 2 or 4; address u64 global, u32 shared)
  St,          // space[a + offset] = srcs[1..1+vec)
  AtomAdd,     // dst = old; space[a + offset] += b  (f32 or u32)
  Bar,         // bar.sync 0: every thread of the block
  Shfl,        // dst = shfl.sync.mode.b32(a, b = lane/delta, c = clamp), full mask 0xffffffff
  Ret,         // the thread exits
  Membar,      // membar.gl: this thread's earlier global writes are seen by the whole GPU before its later ones
  // mma.sync.aligned (full warp, row-major A, column-major B): D = A B + C on one warp's tile,
  // each lane holding the fragments the PTX ISA's layout tables assign it (KernelBuilder::mma).
  Mma,
  // dst (f32) = a (f32) rounded to tf32 (10 mantissa bits), to nearest with ties away from zero
  // (cvt.rna.tf32.f32): the operands mma.sync tf32 should be given.
  RoundTf32,
  // ldmatrix.sync.aligned.m8n8.x{vec}{.trans}.shared.b16 (full warp): `vec` 8x8 matrices of
  // 16-bit elements, row r of matrix m at the shared address (u32) that lane 8m + r gives (16
  // bytes, 16-byte aligned); dsts[m] (u32) of lane l holds row l / 4, elements 2 (l % 4) (low
  // half) and 2 (l % 4) + 1 of matrix m, or with `trans` column l / 4, rows 2 (l % 4) and
  // 2 (l % 4) + 1: the A and B fragments of mma.sync m16n8k16 (KernelBuilder::ldmatrix).
  Ldmatrix,
  // cp.async.{ca,cg}.shared.global [a], [b], vec, c: an asynchronous copy of `vec` bytes (4, 8
  // or 16; 16 is cached in L2 only, .cg) from global b (u64) to shared a (u32), of which only the
  // first c (u32, at most vec) are read and the rest zero-filled. It lands in shared memory when
  // the thread's CpAsyncWait lets its group complete; other threads see it after a barrier.
  CpAsync,
  CpAsyncCommit,  // cp.async.commit_group: this thread's copies since the last commit form a group
  CpAsyncWait,    // cp.async.wait_group `offset`: all but the newest `offset` committed groups land
  // dst (u32) = a (f32) rounded to bf16 in the low half, b (f32) rounded to bf16 in the high
  // half, to nearest with ties to even (cvt.rn.bf16x2.f32 d, b, a): the packed pair mma.sync
  // bf16 takes, made from f32 values in registers (KernelBuilder::pack_bf16x2).
  PackBf16x2,
  // sm_90a's warpgroup matrix product (KernelBuilder::wgmma; kernels with it print for sm_90a
  // only): wgmma.mma_async.sync.aligned.m64n{vec}k16.f32.bf16.bf16 over the 4 warps of an aligned
  // warpgroup (threads 128 w .. + 127), D += A B with A (64 x 16) and B (16 x vec) read from shared
  // memory through the matrix descriptors srcs[0] and srcs[1] (u64, WgmmaDescriptor), `trans`
  // (A) and `trans_b` (B) marking an operand stored MN-major (rows contiguous) instead of
  // K-major. dsts are the vec / 2 f32 accumulators of this thread and srcs[2..] the same
  // registers (read as C): warp w % 4 of the group holds rows 16 (w % 4) + g and + 8 (g = lane /
  // 4), and dsts[4 j + i] column 8 j + 2 (lane % 4) + i % 2 of row + 8 (i / 2). The product is
  // asynchronous: it may read its shared operands and the accumulators any time until a
  // WgmmaWait completes its group, which writes D; until then no other instruction may touch
  // them (the simulator reads the operands at issue and reports bytes changed, or accumulators
  // written, before the wait). A WgmmaFence must come between this thread's other accesses to
  // the accumulators and the next Wgmma.
  Wgmma,
  WgmmaFence,   // wgmma.fence.sync.aligned: orders register accesses before the next Wgmma
  WgmmaCommit,  // wgmma.commit_group.sync.aligned: the warpgroup's Wgmmas since the last commit form a group
  WgmmaWait,    // wgmma.wait_group.sync.aligned `offset`: all but the newest `offset` groups complete
  // fence.proxy.async.shared::cta: this thread's earlier shared writes are seen by Wgmma's reads
  // that a barrier orders after it (sm_90 and up: such kernels also print for sm_90a only).
  FenceProxyAsync,
  // sm_90's transaction barriers and tensor copies (kernels with them print for sm_90a only).
  // An mbarrier is 8 bytes of shared memory that counts arrivals and expected bytes per phase:
  // a phase completes once its `count` arrivals have come and every byte it expects has landed;
  // then the next phase begins, numbered one higher (phases alternate in parity).
  MbarrierInit,  // mbarrier.init.shared::cta.b64 [a], b: the barrier at shared a (u32, 8-aligned), b (u32) arrivals a
                 // phase
  // fence.mbarrier_init.release.cluster: this thread's earlier inits are seen by the tensor
  // copies (the async proxy) that complete on those barriers.
  FenceMbarrierInit,
  // mbarrier.arrive.expect_tx.shared::cta.b64 _, [a], b: one arrival on the barrier at a, whose
  // current phase now also waits for b (u32) more bytes.
  MbarrierArriveExpectTx,
  // Waits until the phase of parity b (u32, 0 or 1) of the barrier at a has completed
  // (mbarrier.try_wait.parity.shared::cta.b64 in a loop; `offset` numbers the loop's label; on a
  // GPU the kernel traps after 2^28 tries rather than hang). Bytes that tensor copies completing
  // on that phase wrote are then seen by this thread.
  MbarrierWait,
  // cp.async.bulk.tensor.{vec}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes: the box
  // of the tensor map at global b (u64, a CUtensorMap of 128 bytes, 64-byte aligned) whose
  // first element has coordinates srcs[3..3+vec) (s32, innermost first; elements outside the
  // tensor read as zero) lands at shared a (u32; 128-byte aligned, 1024 with the 128-byte
  // swizzle), laid out as the map says, and its bytes count against the current phase of the
  // barrier at shared c (u32) once they land. One thread issues it.
  TensorCopy,
  // fence.proxy.tensormap::generic.acquire.sys [a], 128: the tensor map at global a (u64), written
  // through the generic proxy (a copy from the host), is seen by this thread's tensor copies
  // (PTX 8.3: kernels with it print for that ISA).
  FenceProxyTensormap,
};
constexpr Opc kLastOpc = Opc::FenceProxyTensormap;  // the opcode table's length: move it when appending

// The opcode table (kOpcodes, kir.cpp): each opcode's name, group and ISA, in Opc order (a
// missing or misplaced row fails to compile). The builder's diagnostics (describe) read the
// name; the checker and the simulator's preparation dispatch on the group to one handler each,
// and a handler given an opcode of its group that it has no case for throws, naming it; the
// printer's .target and .version come from the ISA columns (needs_sm90a, min_ptx_version). The
// interpreter runs the preparation's own opcodes (sim::Code), one per (operation, type).
enum class OpcGroup : uint8_t {
  arith,       // arithmetic, comparisons, conversions, f32 approximations (one destination)
  memory,      // parameters, special registers, shared addresses, loads, stores, atomics
  sync,        // barriers, shuffles, exit, memory fences
  matrix,      // mma.sync, ldmatrix, wgmma and its fences
  async_copy,  // cp.async, mbarriers, tensor copies
};
struct OpcInfo {
  Opc op;
  const char* name;  // the PTX mnemonic's stem, for diagnostics
  OpcGroup group;
  bool sm90a;   // PTX for sm_90a only (wgmma, mbarriers, tensor copies and their fences)
  int min_ptx;  // the lowest PTX ISA version with it, times 10 (83: 8.3); 0: every ISA kiln prints
};
const OpcInfo& opc_info(Opc op);
inline const char* opc_name(Opc op) { return opc_info(op).name; }
inline OpcGroup opc_group(Opc op) { return opc_info(op).group; }

struct Instr {
  Opc op = Opc::Mov;
  Type type = Type::u32;      // operation type
  Type src_type = Type::u32;  // Cvt: the source type
  std::vector<Reg> dsts;      // one destination (or vec of them for vector loads), none for St/Bar/Ret
  std::vector<Operand> srcs;  // a, b, c; for St: address, then values
  Cmp cmp = Cmp::eq;
  ShflMode shfl = ShflMode::down;
  MmaShape mma = MmaShape::m16n8k8_tf32;  // Mma: dsts D[4]; srcs A[4], B[2], C[4]
  SReg sreg = SReg::tid_x;
  Space space = Space::global;
  int32_t param = 0;     // LdParam
  int32_t shared = 0;    // SharedAddr
  int32_t vec = 1;       // Ld/St vector width; Ldmatrix: matrices (1, 2 or 4)
  bool trans = false;    // Ldmatrix: transposed; Wgmma: A MN-major
  bool trans_b = false;  // Wgmma: B MN-major
  int64_t offset = 0;    // Ld/St/AtomAdd byte offset added to the address
};

// Structured statements: an instruction (optionally guarded by a predicate), if/else, or a
// counted loop `for (var = begin; var < end; var += step)` (signed or unsigned compare by the
// var's type). The loop's condition register `cond` is allocated by the builder so that the
// printer makes no decisions.
struct Stmt {
  enum class Kind : uint8_t { Instr, If, For } kind = Kind::Instr;
  Instr instr;
  Reg guard;                 // Instr: run only where guard (pred) is true (!guard with negate)
  bool negate = false;       // Instr guard / If condition negated
  Reg cond;                  // If: the predicate; For: the loop-condition predicate
  Reg var;                   // For
  Operand begin, end, step;  // For
  std::vector<Stmt> body;    // If: then; For: body
  std::vector<Stmt> else_body;
  int32_t label = 0;  // If/For: unique number for the printed labels
};

struct Param {
  std::string name;
  Type type;  // u64 for pointers
};

struct SharedArray {
  std::string name;
  int64_t bytes = 0;
  int32_t align = 16;
};

// A block may declare this much shared memory statically. A kernel whose arrays take more has
// them carved out of one dynamic allocation instead: the printer declares it extern, the launch
// passes its size, and the runtime raises the function's limit to it first.
constexpr int64_t kStaticSharedLimit = 48 * 1024;
// The most shared memory a kernel may take: sm_86's and sm_89's 99 KiB a block, so that PTX for
// sm_80 runs on every device of that target (an A100 has 163 KiB, an H100 227 KiB).
constexpr int64_t kMaxSharedBytes = 99 * 1024;
// Kernels for sm_90a only (needs_sm90a) may take an H100's 227 KiB.
constexpr int64_t kMaxSharedBytesSm90a = 227 * 1024;

struct Kernel {
  std::string name;
  std::vector<Param> params;
  std::vector<SharedArray> shared;
  std::vector<Stmt> body;
  int32_t num_regs[kNumTypes] = {};  // registers allocated per type
  int32_t num_labels = 0;
  // The block's threads where it declares them (.maxntid; 0: not declared), so that ptxas keeps
  // each thread's registers within the register file's 65536 / max_threads.
  int32_t max_threads = 0;
  // Blocks an SM must hold at once where the kernel asks for them (.minnctapersm, with .maxntid;
  // 0: not asked): ptxas then keeps each thread within 65536 / (max_threads x this) registers.
  int32_t min_blocks_per_sm = 0;
  int64_t shared_bytes() const;  // total, each array at its alignment, in declaration order
  int64_t shared_offset(int array) const;
  // The bytes a launch must pass as dynamic shared memory: shared_bytes() above
  // kStaticSharedLimit, else 0 (the arrays are static).
  int64_t dynamic_shared_bytes() const;
  int64_t static_shared_bytes() const { return dynamic_shared_bytes() > 0 ? 0 : shared_bytes(); }  // declared static
};

// Whether a kernel uses instructions of sm_90a only (OpcInfo::sm90a: wgmma, its fence and group
// operations, FenceProxyAsync, mbarriers and tensor copies): it prints for sm_90a and loads on
// sm_90 devices only.
bool needs_sm90a(const Kernel& k);
// The lowest PTX ISA version (times 10) that has every instruction of the kernel (OpcInfo::min_ptx;
// 0 where the target's own ISA has them all).
int min_ptx_version(const Kernel& k);
// kMaxSharedBytesSm90a for those, else kMaxSharedBytes.
int64_t max_shared_bytes(const Kernel& k);

// Structural checks: shared memory within max_shared_bytes, operand types match the operation,
// registers are allocated, and no thread can leave (Ret) before a bar.sync or a full-mask
// shfl.sync that follows it in program order (such an exit would hang the block or leave the
// shuffle with missing lanes: guard the work with an If instead). Throws kiln::Error naming the
// kernel and the instruction.
void check(const Kernel& k);

// Text of one instruction for error messages and dumps (not PTX).
std::string describe(const Kernel& k, const Instr& in);

// Builds a kernel statement by statement. Each arithmetic call appends one instruction and
// returns its destination register:
//   KernelBuilder b("scale");
//   Reg x = b.param("x", Type::u64), n = b.param("n", Type::u32);
//   Reg i = b.global_index_x();
//   b.if_(b.setp(Cmp::lt, i, n), [&] {
//     Reg a = b.address(x, i, 4);
//     b.st(Space::global, Type::f32, a, b.mul(Type::f32, b.ld(Space::global, Type::f32, a), imm_f32(2)));
//   });
//   Kernel k = b.finish();
class KernelBuilder {
 public:
  explicit KernelBuilder(std::string name);

  Reg reg(Type t);
  // Declares a kernel parameter and loads it into a register (ld.param at the current point).
  Reg param(const std::string& name, Type t);
  // Declares a shared array; returns its index (use shared_addr to get its offset).
  int shared_array(const std::string& name, int64_t bytes, int32_t align = 16);
  // Declares the block's thread count (Kernel::max_threads) for ptxas's register allocation.
  void declare_block_threads(int32_t threads) { k_.max_threads = threads; }
  // Asks ptxas for `blocks` blocks an SM (Kernel::min_blocks_per_sm); needs declare_block_threads.
  void declare_min_blocks_per_sm(int32_t blocks) { k_.min_blocks_per_sm = blocks; }
  Reg shared_addr(int array);
  Reg sreg(SReg s);

  Reg mov(Type t, Operand a);
  // dst = op(srcs) into an existing register (accumulators and loop-carried values), where
  // the calls above would return a fresh one; set(dst, a) is assign(Mov, dst, {a}).
  void assign(Opc op, Reg dst, std::vector<Operand> srcs);
  void set(Reg dst, Operand a) { assign(Opc::Mov, dst, {a}); }
  Reg add(Type t, Operand a, Operand b);
  Reg sub(Type t, Operand a, Operand b);
  Reg mul(Type t, Operand a, Operand b);
  Reg mul_hi(Type t, Operand a, Operand b);
  Reg mul_wide(Type src, Operand a, Operand b);
  Reg mad(Type t, Operand a, Operand b, Operand c);
  Reg fma(Type t, Operand a, Operand b, Operand c);
  Reg div(Type t, Operand a, Operand b);
  Reg rem(Type t, Operand a, Operand b);
  Reg min(Type t, Operand a, Operand b);
  Reg max(Type t, Operand a, Operand b);
  Reg neg(Type t, Operand a);
  Reg abs(Type t, Operand a);
  Reg and_(Type t, Operand a, Operand b);
  Reg or_(Type t, Operand a, Operand b);
  Reg xor_(Type t, Operand a, Operand b);
  Reg not_(Type t, Operand a);
  Reg shl(Type t, Operand a, Operand b);
  Reg shr(Type t, Operand a, Operand b);
  Reg setp(Cmp c, Operand a, Operand b);  // compares in a's type
  Reg selp(Type t, Operand a, Operand b, Operand c);
  Reg cvt(Type to, Operand a);           // from a's type
  Reg unary(Opc op, Type t, Operand a);  // Ex2, Lg2, Rcp, Rsqrt, Sqrt, Tanh, Sin, Cos, Neg, Abs, Not, RoundTf32

  Reg ld(Space s, Type t, Operand addr, int64_t offset = 0);
  std::vector<Reg> ld_vec(Space s, Type t, Operand addr, int vec, int64_t offset = 0);
  void st(Space s, Type t, Operand addr, Operand value, int64_t offset = 0);
  void st_vec(Space s, Type t, Operand addr, const std::vector<Operand>& values, int64_t offset = 0);
  Reg atom_add(Space s, Type t, Operand addr, Operand value, int64_t offset = 0);
  void bar();
  Reg shfl(ShflMode m, Operand value, Operand lane_or_delta, Operand clamp = imm_u32(31));
  // `count` (1, 2, 4) 8x8 b16 matrices from the row addresses the lanes give (Opc::Ldmatrix).
  std::vector<Reg> ldmatrix(int count, bool trans, Operand row_address);
  // Opc::CpAsync and its group operations.
  void cp_async(Operand shared_dst, Operand global_src, int bytes, Operand src_bytes);
  void cp_async_commit();
  void cp_async_wait(int pending_groups);
  // Opc::PackBf16x2: lo and hi (f32) rounded to bf16 and packed, lo in the low half.
  Reg pack_bf16x2(Operand lo, Operand hi);
  // Opc::Wgmma for the warpgroup (all 128 threads): acc (n / 2 f32 registers, n a multiple of 8
  // up to 256) += A B through the descriptors; and its fence and group operations.
  void wgmma(int n, Operand desc_a, bool a_mn_major, Operand desc_b, bool b_mn_major, const std::vector<Reg>& acc);
  void wgmma_fence();
  void wgmma_commit();
  void wgmma_wait(int pending_groups);
  void fence_proxy_async();
  // Opc::MbarrierInit and the other mbarrier operations, and Opc::TensorCopy (`coords`: 1 to 5
  // s32 coordinates, innermost first).
  void mbarrier_init(Operand barrier, Operand arrivals);
  void fence_mbarrier_init();
  void mbarrier_arrive_expect_tx(Operand barrier, Operand bytes);
  void mbarrier_wait(Operand barrier, Operand parity);
  void tensor_copy(Operand shared_dst, Operand tensor_map, Operand barrier, const std::vector<Operand>& coords);
  void fence_proxy_tensormap(Operand tensor_map);
  // D = A B + C for the warp (every lane must take part): a[4], b[2] (f32 for tf32, u32 packed
  // pairs for bf16/f16), c[4] f32; returns D's 4 f32 registers of this lane.
  std::vector<Reg> mma(MmaShape shape, const std::vector<Operand>& a, const std::vector<Operand>& b,
                       const std::vector<Operand>& c);
  void ret();
  void membar();  // membar.gl

  // Appends a raw instruction (tests build malformed kernels this way).
  void emit(Instr in, Reg guard = {}, bool negate = false);

  void if_(Reg cond, const std::function<void()>& then_body, const std::function<void()>& else_body = {});
  void if_not(Reg cond, const std::function<void()>& then_body);
  // for (var = begin; var < end; var += step) body(var); var has begin's type (u32/s32/u64/s64).
  void for_(Operand begin, Operand end, Operand step, const std::function<void(Reg)>& body);

  // Conveniences built from the above.
  Reg global_index_x();                             // ctaid.x * ntid.x + tid.x (u32)
  Reg address(Reg base, Operand index, int bytes);  // base (u64) + index * bytes, index u32 or u64

  Kernel finish();  // runs check()

 private:
  Reg emit_op(Opc op, Type t, std::vector<Operand> srcs, Type dst_type);
  // Barriers, fences, commits, waits and mbarrier operations: instructions with no destination
  // and no vector width (a wait's pending groups and an mbarrier wait's label go in `offset`).
  void emit_effect(Opc op, std::vector<Operand> srcs = {}, Type t = Type::u32, Space space = Space::global,
                   int64_t offset = 0);
  Kernel k_;
  std::vector<std::vector<Stmt>*> stack_;  // innermost open body last
};

}  // namespace kiln::kir
