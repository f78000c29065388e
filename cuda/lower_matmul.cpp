// Lowering of batched matmul: a: (..., M, K) [ta: (..., K, M)], b: (..., K, N) [tb: (..., N, K)]
// -> c: (batch..., M, N), assigned (not accumulated). Tiled in shared memory: a block of 256
// threads computes a 64x64 tile of c over K in steps of 16; each thread holds a 4x4 block of
// accumulators in registers and reads its operands from shared memory as 16-byte vectors.
// Tiles are loaded with the transposes folded into the addressing (each load reads along the
// operand's contiguous axis) and zero-filled outside the matrix, so no size needs to be a
// multiple of the tile. Batch dims broadcast: grid z walks the output batch, and an operand's
// batch offset has stride 0 along its broadcast dims. FFMA in f32 (tensor cores come later).
#include <spdlog/fmt/fmt.h>

#include "circuit/error.hpp"
#include "cuda/lower_elementwise.hpp"

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;
using kir::SReg;

namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256, kPerThread = 4;
constexpr int kTileLoads = kTileM * kTileK / kThreads;  // elements of each tile a thread loads

// Element strides of an operand's batch dims as seen from the output's batch coordinates.
std::vector<int64_t> batch_strides(const Shape& operand, const Shape& out_batch) {
  std::vector<int64_t> dims(operand.dims().begin(), operand.dims().end() - 2);
  int64_t matrix = operand[operand.rank() - 1] * operand[operand.rank() - 2];
  std::vector<int64_t> st = broadcast_strides(Shape(dims), out_batch);
  for (auto& s : st) s *= matrix;
  return st;
}

// One operand tile: element (row r, k) of the operand's [rows x K] view, stored row-major
// (contiguous along k) unless `transposed` (contiguous along rows). Stored in shared memory
// as tile[k][r] so that a thread's 4 consecutive rows are one 16-byte vector.
struct TileLoader {
  Reg base;  // the operand's batch base address
  bool transposed = false;
  int64_t rows = 0, depth = 0;      // the operand's M (or N) and K
  std::vector<Reg> tile_r, tile_k;  // per load slot: row and k within the tile (index type)
  std::vector<Reg> row_ok;          // per load slot: row0 + r < rows
  std::vector<Reg> smem_addr;       // per load slot: shared address of tile[k][r]
};

TileLoader make_loader(KernelBuilder& b, Type it, Reg base, bool transposed, int64_t rows, int64_t depth, Reg row0,
                       Reg tid, Reg smem) {
  TileLoader t{base, transposed, rows, depth, {}, {}, {}, {}};
  for (int s = 0; s < kTileLoads; ++s) {
    Reg l = b.add(Type::u32, tid, imm_u32(static_cast<uint32_t>(s * kThreads)));
    // Consecutive threads read consecutive addresses: along rows when transposed, else along k.
    Reg r = transposed ? b.rem(Type::u32, l, imm_u32(kTileM)) : b.div(Type::u32, l, imm_u32(kTileK));
    Reg k = transposed ? b.div(Type::u32, l, imm_u32(kTileM)) : b.rem(Type::u32, l, imm_u32(kTileK));
    Reg r_it = it == Type::u32 ? r : b.cvt(Type::u64, r);
    Reg k_it = it == Type::u32 ? k : b.cvt(Type::u64, k);
    t.tile_r.push_back(b.add(it, row0, r_it));
    t.tile_k.push_back(k_it);
    t.row_ok.push_back(b.setp(Cmp::lt, t.tile_r.back(), imm_index(it, rows)));
    t.smem_addr.push_back(b.mad(Type::u32, b.mad(Type::u32, k, imm_u32(kTileM), r), imm_u32(4), smem));
  }
  return t;
}

void load_tile(KernelBuilder& b, Type it, const TileLoader& t, Reg k0) {
  for (int s = 0; s < kTileLoads; ++s) {
    Reg kg = b.add(it, k0, t.tile_k[static_cast<size_t>(s)]);
    Reg ok = b.and_(Type::pred, t.row_ok[static_cast<size_t>(s)], b.setp(Cmp::lt, kg, imm_index(it, t.depth)));
    Reg elem = t.transposed ? b.mad(it, kg, imm_index(it, t.rows), t.tile_r[static_cast<size_t>(s)])
                            : b.mad(it, t.tile_r[static_cast<size_t>(s)], imm_index(it, t.depth), kg);
    Reg addr = b.address(t.base, elem, 4);
    Reg v = b.mov(Type::f32, imm_f32(0.0f));
    kir::Instr ld;
    ld.op = kir::Opc::Ld;
    ld.type = Type::f32;
    ld.space = Space::global;
    ld.dsts = {v};
    ld.srcs = {addr};
    b.emit(ld, ok);
    b.st(Space::shared, Type::f32, t.smem_addr[static_cast<size_t>(s)], v);
  }
}

}  // namespace

LoweredOp lower_matmul(const Circuit& c, const Op& op) {
  const ValueInfo& A = c.info(op.inputs[0]);
  const ValueInfo& B = c.info(op.inputs[1]);
  const ValueInfo& C = c.info(op.outputs[0]);
  const bool ta = op.params.ints[0] != 0, tb = op.params.ints[1] != 0;
  const int rc = C.shape.rank();
  const int64_t M = C.shape[rc - 2], N = C.shape[rc - 1];
  const int64_t K = ta ? A.shape[A.shape.rank() - 2] : A.shape[A.shape.rank() - 1];
  const Shape out_batch(std::vector<int64_t>(C.shape.dims().begin(), C.shape.dims().end() - 2));
  const int64_t batch = out_batch.numel();
  const int64_t grid_m = (M + kTileM - 1) / kTileM, grid_n = (N + kTileN - 1) / kTileN;
  if (batch > 65535 || grid_m > 65535)
    fail("matmul", op.scope,
         "batch " + std::to_string(batch) + " or " + std::to_string(grid_m) +
             " row tiles exceed the grid's y/z limit of 65535");
  const Type it = index_type(std::max({A.shape.numel(), B.shape.numel(), C.shape.numel()}));

  KernelBuilder b("kiln_matmul");
  Reg pa = b.param("a", Type::u64), pb = b.param("b", Type::u64), pc = b.param("c", Type::u64);
  Reg tid = b.sreg(SReg::tid_x);
  Reg tx = b.and_(Type::u32, tid, imm_u32(15)), ty = b.shr(Type::u32, tid, imm_u32(4));
  auto widen = [&](Reg r) { return it == Type::u32 ? r : b.cvt(Type::u64, r); };
  Reg m0 = widen(b.mul(Type::u32, b.sreg(SReg::ctaid_y), imm_u32(kTileM)));
  Reg n0 = widen(b.mul(Type::u32, b.sreg(SReg::ctaid_x), imm_u32(kTileN)));

  // Batch offsets of a, b and c for output batch index z.
  Reg z = widen(b.sreg(SReg::ctaid_z));
  std::vector<Reg> zc = coordinates(b, z, out_batch.dims());
  Reg a_base = b.address(pa, linear_offset(b, zc, batch_strides(A.shape, out_batch), 0), 4);
  Reg b_base = b.address(pb, linear_offset(b, zc, batch_strides(B.shape, out_batch), 0), 4);
  Reg c_base = b.address(pc, b.mul(it, z, imm_index(it, M * N)), 4);

  Reg as = b.shared_addr(b.shared_array("a_tile", 4 * kTileK * kTileM));
  Reg bs = b.shared_addr(b.shared_array("b_tile", 4 * kTileK * kTileN));
  // a's [M x K] view is contiguous along K unless ta; b's [N x K] view is contiguous along K
  // only when tb.
  TileLoader la = make_loader(b, it, a_base, ta, M, K, m0, tid, as);
  TileLoader lb = make_loader(b, it, b_base, !tb, N, K, n0, tid, bs);

  std::vector<Reg> acc;
  for (int e = 0; e < kPerThread * kPerThread; ++e) acc.push_back(b.mov(Type::f32, imm_f32(0.0f)));
  Reg a_frag = b.mad(Type::u32, ty, imm_u32(4 * kPerThread), as);
  Reg b_frag = b.mad(Type::u32, tx, imm_u32(4 * kPerThread), bs);
  b.for_(imm_index(it, 0), imm_index(it, K), imm_index(it, kTileK), [&](Reg k0) {
    load_tile(b, it, la, k0);
    load_tile(b, it, lb, k0);
    b.bar();
    for (int kk = 0; kk < kTileK; ++kk) {
      std::vector<Reg> av = b.ld_vec(Space::shared, Type::f32, a_frag, 4, 4 * kk * kTileM);
      std::vector<Reg> bv = b.ld_vec(Space::shared, Type::f32, b_frag, 4, 4 * kk * kTileN);
      for (int i = 0; i < kPerThread; ++i)
        for (int j = 0; j < kPerThread; ++j)
          b.assign(
              kir::Opc::Fma, acc[static_cast<size_t>(i * kPerThread + j)],
              {av[static_cast<size_t>(i)], bv[static_cast<size_t>(j)], acc[static_cast<size_t>(i * kPerThread + j)]});
    }
    b.bar();
  });
  Reg row0 = b.add(it, m0, widen(b.mul(Type::u32, ty, imm_u32(kPerThread))));
  Reg col0 = b.add(it, n0, widen(b.mul(Type::u32, tx, imm_u32(kPerThread))));
  for (int i = 0; i < kPerThread; ++i) {
    Reg row = b.add(it, row0, imm_index(it, i));
    Reg row_ok = b.setp(Cmp::lt, row, imm_index(it, M));
    for (int j = 0; j < kPerThread; ++j) {
      Reg col = b.add(it, col0, imm_index(it, j));
      Reg ok = b.and_(Type::pred, row_ok, b.setp(Cmp::lt, col, imm_index(it, N)));
      b.if_(ok, [&] {
        b.st(Space::global, Type::f32, b.address(c_base, b.mad(it, row, imm_index(it, N), col), 4),
             acc[static_cast<size_t>(i * kPerThread + j)]);
      });
    }
  }
  LoweredOp r;
  r.launches.push_back(finish_launch(
      b, "kiln_matmul", {static_cast<uint32_t>(grid_n), static_cast<uint32_t>(grid_m), static_cast<uint32_t>(batch)},
      {kThreads, 1, 1}, {{ArgRef::Kind::Input, 0}, {ArgRef::Kind::Input, 1}, {ArgRef::Kind::Output, 0}}));
  r.summary = fmt::format("matmul ta={} tb={}: tile {}x{}x{}, {} threads x {}x{} outputs, {}", ta, tb, kTileM, kTileN,
                          kTileK, kThreads, kPerThread, kPerThread, launch_text(r.launches.back()));
  return r;
}

}  // namespace kiln::cuda
