// The FFMA-tile matmul kernel's operand tiles (matmul_tiles.hpp).
#include <cstdlib>
#include <limits>
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/matmul_tiles.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;

namespace {

// Whether every run of 4 elements of `v` that starts at a multiple of 4 along its contiguous
// dim, the other dim stepping by `stride`, starts 16 bytes aligned (f32, buffers 16-byte aligned).
bool aligned_chunks(const MatmulOperand& v, int64_t stride) {
  bool ok = stride % 4 == 0 && v.offset % 4 == 0;
  for (int64_t s : v.batch) ok = ok && s % 4 == 0;
  return ok;
}

bool aligned_k_groups(const MatmulOperand& v, int64_t depth) {
  return v.k_stride == 1 && depth % 4 == 0 && aligned_chunks(v, v.row_stride);
}

// The f32 value a tile holds for x as loaded (where `ok`): the prologue applied, 0 outside the
// matrix whatever the prologue makes of 0; in tf32 tiles rounded to tf32 (mma.sync would
// otherwise drop the low bits: truncation, twice the error). A bf16 x is widened to f32 (exact;
// bf16 operands take no prologue), and is then a tf32 value already.
Reg tile_value(KernelBuilder& b, const TileLoader& t, Reg x, Reg ok) {
  if (x.type == Type::bf16) return b.cvt(Type::f32, x);
  if (t.view->prologue != se::in(0))
    x = b.selp(Type::f32, emit_scalar_exp(b, t.view->prologue, {x}), imm_f32(0.0f), ok);
  if (t.tf32 && t.view->prologue != se::round_bf16(se::in(0))) x = b.unary(kir::Opc::RoundTf32, Type::f32, x);
  return x;
}

// Whether an operand read along its rows can be copied by cp.async into FFMA tiles: f32 as
// multiplied (no prologue, no tf32 rounding), every 4-row chunk 16-byte aligned (buffers start at
// 16-byte boundaries), and a tile's chunks a whole number of each thread's.
bool async_copyable(const MatmulOperand& v, DType dtype, int tm, int pitch, bool tf32) {
  return dtype == DType::f32 && v.prologue == se::in(0) && !tf32 && aligned_chunks(v, v.k_stride) && pitch % 4 == 0 &&
         tm * kMatmulTileK / 4 % kMatmulThreads == 0 && kMatmulThreads % (tm / 4) == 0;
}

}  // namespace

TileLoader make_loader(KernelBuilder& b, Type it, Reg base, const MatmulOperand& view, DType dtype, int64_t rows,
                       int64_t depth, int tm, int pitch, bool tf32, Reg row0, Reg tid, Reg smem) {
  const bool along_rows = view.k_stride != 1 && view.row_stride == 1;
  TileLoader t;
  t.base = base;
  t.view = &view;
  t.k_groups = !along_rows;
  t.vector_k = !along_rows && aligned_k_groups(view, depth);
  t.rows = rows;
  t.depth = depth;
  t.tm = tm;
  t.pitch = pitch;
  t.tf32 = tf32;
  t.dtype = dtype;
  auto add_values = [&] {
    for (int j = 0; j < t.per_slot(); ++j) {
      t.values.push_back(b.mov(kir_type(dtype), kir::Operand::imm(kir_type(dtype), 0)));
      t.oks.push_back(b.setp(Cmp::eq, imm_u32(0), imm_u32(0)));
    }
  };
  auto add_slot = [&](Reg r, Reg k) {
    t.tile_r.push_back(b.add(it, row0, it == Type::u32 ? r : b.cvt(Type::u64, r)));
    t.tile_k.push_back(it == Type::u32 ? k : b.cvt(Type::u64, k));
    t.row_ok.push_back(b.setp(Cmp::lt, t.tile_r.back(), imm_index(it, rows)));
    t.smem_addr.push_back(
        b.mad(Type::u32, b.mad(Type::u32, k, imm_u32(static_cast<uint32_t>(pitch)), r), imm_u32(4), smem));
    add_values();
  };
  const auto tm32 = static_cast<uint32_t>(tm);
  if (t.k_groups) {
    Reg r = b.rem(Type::u32, tid, imm_u32(tm32));
    Reg k = b.mul(Type::u32, b.div(Type::u32, tid, imm_u32(tm32)), imm_u32(4));
    const int groups = tm * kMatmulTileK / (4 * kMatmulThreads), group_stride = 4 * kMatmulThreads / tm;
    for (int g = 0; g < groups; ++g)
      add_slot(r, g == 0 ? k : b.add(Type::u32, k, imm_u32(static_cast<uint32_t>(g * group_stride))));
    return t;
  }
  if (async_copyable(view, dtype, tm, pitch, tf32)) {
    t.async = true;
    const uint32_t row_chunks = tm32 / 4;
    t.k_step = kMatmulThreads / row_chunks;
    t.async_chunks = tm * kMatmulTileK / 4 / kMatmulThreads;
    Reg r = b.mul(Type::u32, b.rem(Type::u32, tid, imm_u32(row_chunks)), imm_u32(4));
    Reg k = b.div(Type::u32, tid, imm_u32(row_chunks));
    t.tile_r.push_back(b.add(it, row0, it == Type::u32 ? r : b.cvt(Type::u64, r)));
    t.tile_k.push_back(it == Type::u32 ? k : b.cvt(Type::u64, k));
    t.smem_addr.push_back(
        b.mad(Type::u32, b.mad(Type::u32, k, imm_u32(static_cast<uint32_t>(pitch)), r), imm_u32(4), smem));
    // The rows of the thread's chunk inside the matrix, in bytes (0 to 16): the copy's source size.
    Reg left = b.min(it, b.sub(it, imm_index(it, rows), t.tile_r[0]), imm_index(it, 4));  // where row < rows
    Reg bytes = b.mul(Type::u32, it == Type::u32 ? left : b.cvt(Type::u32, left), imm_u32(4));
    t.chunk_bytes = b.selp(Type::u32, bytes, imm_u32(0), b.setp(Cmp::lt, t.tile_r[0], imm_index(it, rows)));
    return t;
  }
  if (kMatmulThreads % tm != 0)
    throw Error("make_loader: tiles of " + std::to_string(tm) + " rows do not divide a block");
  t.k_step = kMatmulThreads / tm;
  add_slot(b.rem(Type::u32, tid, imm_u32(tm32)), b.div(Type::u32, tid, imm_u32(tm32)));
  for (int s = 1; s < tm * kMatmulTileK / kMatmulThreads; ++s) add_values();
  return t;
}

std::vector<Reg> guarded_load(KernelBuilder& b, Type type, Reg addr, int vec, Reg ok, int64_t offset) {
  kir::Instr ld;
  ld.op = kir::Opc::Ld;
  ld.type = type;
  ld.space = Space::global;
  ld.vec = vec;
  ld.offset = offset;
  for (int j = 0; j < vec; ++j) ld.dsts.push_back(b.mov(type, kir::Operand::imm(type, 0)));
  ld.srcs = {addr};
  b.emit(ld, ok);
  return ld.dsts;
}

void fetch_tile(KernelBuilder& b, Type it, const TileLoader& t, Reg k0, int64_t offset) {
  const MatmulOperand& v = *t.view;
  auto element = [&](Reg r, Reg kg) {  // address of element (r, kg)
    Reg k_part = v.k_stride == 1 ? kg : b.mul(it, kg, imm_index(it, v.k_stride));
    return b.address(t.base, scaled_add(b, it, r, v.row_stride, k_part), static_cast<int>(dtype_size(t.dtype)));
  };
  if (t.async) {  // chunk s: chunk 0 moved k_step s along k, in the operand and in the tile
    Reg k_first = b.add(it, k0, t.tile_k[0]);
    Reg first = element(t.tile_r[0], k_first);
    const int64_t chunk_stride = t.k_step * v.k_stride * 4;  // bytes from one chunk to the next
    for (int s = 0; s < t.async_chunks; ++s) {
      Reg kg = s == 0 ? k_first : b.add(it, k_first, imm_index(it, int64_t{s} * t.k_step));
      Reg bytes = b.selp(Type::u32, t.chunk_bytes, imm_u32(0), b.setp(Cmp::lt, kg, imm_index(it, t.depth)));
      Reg at = s == 0 ? first : b.add(Type::u64, first, kir::imm_u64(static_cast<uint64_t>(s * chunk_stride)));
      // Nothing is read where no byte is copied; the base keeps the address inside the buffer.
      Reg src = b.selp(Type::u64, at, t.base, b.setp(Cmp::ne, bytes, imm_u32(0)));
      Reg dst = b.add(Type::u32, t.smem_addr[0],
                      imm_u32(static_cast<uint32_t>(offset + 4 * int64_t{s} * t.k_step * t.pitch)));
      b.cp_async(dst, src, 16, bytes);
    }
    return;
  }
  if (!t.k_groups) {  // along rows: slot s is slot 0's element k_step s further along k
    Reg k_first = b.add(it, k0, t.tile_k[0]);
    Reg first = element(t.tile_r[0], k_first);
    const int64_t slot_bytes = t.k_step * v.k_stride * static_cast<int64_t>(dtype_size(t.dtype));
    for (size_t s = 0; s < t.values.size(); ++s) {
      const auto ks = static_cast<int64_t>(s);
      Reg kg = s == 0 ? k_first : b.add(it, k_first, imm_index(it, ks * t.k_step));
      Reg ok = b.and_(Type::pred, t.row_ok[0], b.setp(Cmp::lt, kg, imm_index(it, t.depth)));
      // The byte offset as an immediate where it fits PTX's 32 bits, else the address.
      const bool fits = std::abs(ks * slot_bytes) <= std::numeric_limits<int32_t>::max();
      Reg at = fits || s == 0 ? first : element(t.tile_r[0], kg);
      b.set(t.values[s], guarded_load(b, kir_type(t.dtype), at, 1, ok, fits ? ks * slot_bytes : 0)[0]);
      b.set(t.oks[s], ok);
    }
    return;
  }
  for (size_t slot = 0; slot < t.tile_r.size(); ++slot) {
    Reg k_slot = b.add(it, k0, t.tile_k[slot]);
    if (t.vector_k) {  // K is a multiple of 4: a group of 4 k lies wholly inside the matrix or outside
      Reg ok = b.and_(Type::pred, t.row_ok[slot], b.setp(Cmp::lt, k_slot, imm_index(it, t.depth)));
      const std::vector<Reg> x = guarded_load(b, kir_type(t.dtype), element(t.tile_r[slot], k_slot), 4, ok);
      for (size_t j = 0; j < 4; ++j) {
        b.set(t.values[4 * slot + j], x[j]);
        b.set(t.oks[4 * slot + j], ok);
      }
      continue;
    }
    for (int j = 0; j < t.per_slot(); ++j) {
      Reg kg = j == 0 ? k_slot : b.add(it, k_slot, imm_index(it, j));
      Reg ok = b.and_(Type::pred, t.row_ok[slot], b.setp(Cmp::lt, kg, imm_index(it, t.depth)));
      Reg x = guarded_load(b, kir_type(t.dtype), element(t.tile_r[slot], kg), 1, ok)[0];
      const size_t at = static_cast<size_t>(t.per_slot()) * slot + static_cast<size_t>(j);
      b.set(t.values[at], x);
      b.set(t.oks[at], ok);
    }
  }
}

void store_tile(KernelBuilder& b, const TileLoader& t, int64_t offset) {
  if (t.async) return;  // fetch_tile copied it
  if (!t.k_groups) {    // along rows: slot s is k_step s rows of the tile further on
    for (size_t s = 0; s < t.values.size(); ++s)
      b.st(Space::shared, Type::f32, t.smem_addr[0], tile_value(b, t, t.values[s], t.oks[s]),
           offset + 4 * static_cast<int64_t>(s) * t.k_step * t.pitch);
    return;
  }
  for (size_t slot = 0; slot < t.smem_addr.size(); ++slot)
    for (int j = 0; j < t.per_slot(); ++j) {
      const size_t at = static_cast<size_t>(t.per_slot()) * slot + static_cast<size_t>(j);
      b.st(Space::shared, Type::f32, t.smem_addr[slot], tile_value(b, t, t.values[at], t.oks[at]),
           offset + 4 * j * t.pitch);
    }
}

}  // namespace kiln::cuda
