// StagedStores (matmul_staged_stores.hpp): the wgmma matmul kernel's stores through shared memory.
#include <limits>

#include <kiln/cuda/lower/matmul_staged_stores.hpp>

namespace kiln::cuda {

namespace {
using kir::Space;
}  // namespace

std::optional<StagedStores> StagedStores::plan(int tm, int tn, int threads, const std::vector<uint32_t>& bytes,
                                               bool chunks, int64_t shared_bytes, int64_t out_row) {
  const int warps = threads / 32;
  if (tn % 32 != 0 || warps == 0 || out_row <= 0) return std::nullopt;
  StagedStores s;
  s.tm_ = tm;
  s.tn_ = tn;
  s.warps_ = warps;
  s.out_row_ = out_row;
  int64_t used = 0, reach = 0;
  for (uint32_t e : bytes) {
    // A row of tn elements and 8 more: f32 rows of tn + 8 words (8 mod 32) put a warp's 8-byte
    // pair stores (lanes g = l / 4 on 8 rows, q = l % 4 on 4 pairs) on 32 banks in each half of
    // the warp; bf16 rows of tn / 2 + 4 words (4 mod 32) its 4-byte ones on 32 banks at once.
    // Rows start at 16-byte boundaries either way, so a 16-byte chunk of a row is one access.
    const auto pitch = static_cast<uint32_t>(tn + 8) * e;
    const uint32_t access = chunks ? 16 : e;
    const int per_row = tn * static_cast<int>(e) / static_cast<int>(access);  // accesses a row
    const int lanes = std::min(32, per_row);                                  // a warp's lanes on one row
    if (per_row % lanes != 0 || 32 % lanes != 0 || tm % (warps * (32 / lanes)) != 0) return std::nullopt;
    s.outputs_.push_back({e, access, pitch, static_cast<uint32_t>(used), lanes});
    used += int64_t{tm} * pitch;
    reach = std::max(reach, (int64_t{tm} * out_row + tn) * e);
  }
  if (used > shared_bytes || reach > std::numeric_limits<int32_t>::max()) return std::nullopt;
  return s;
}

void StagedStores::begin(KernelBuilder& b, Reg smem, Reg row, Reg col) {
  b.bar();  // every warpgroup's last products have read their stages
  smem_ = smem;
  base_.clear();
  for (const Output& o : outputs_)
    base_.push_back(
        b.mad(Type::u32, row, kir::imm_u32(o.pitch),
              b.mad(Type::u32, col, kir::imm_u32(o.bytes), b.add(Type::u32, smem, kir::imm_u32(o.offset)))));
}

void StagedStores::put(KernelBuilder& b, size_t r, int64_t dr, int64_t dc, const std::array<Reg, 2>& values) const {
  const Output& o = outputs_[r];
  const int64_t at = dr * o.pitch + dc * o.bytes;
  if (o.bytes == 4)
    b.st_vec(Space::shared, Type::f32, base_[r], {values[0], values[1]}, at);
  else
    b.st(Space::shared, Type::u32, base_[r], b.pack_bf16x2(values[0], values[1]), at);  // rounded as a cast rounds
}

void StagedStores::copy_out(KernelBuilder& b, Type it, Reg tid, const std::vector<Reg>& tile) const {
  b.bar();  // every pair is staged
  Reg warp = b.shr(Type::u32, tid, kir::imm_u32(5)), lane = b.and_(Type::u32, tid, kir::imm_u32(31));
  auto widen = [&](Reg r) { return it == Type::u32 ? r : b.cvt(Type::u64, r); };
  for (size_t r = 0; r < outputs_.size(); ++r) {
    const Output& o = outputs_[r];
    // A warp's lanes take o.lanes consecutive accesses of a row (32 / o.lanes rows at once where
    // a row has fewer accesses than lanes); warp w takes rows w, w + warps, ... of such groups.
    // Every store instruction of a warp then writes consecutive bytes of each of its rows.
    const auto lanes = static_cast<uint32_t>(o.lanes), rows_at_once = 32 / lanes;
    const int64_t elements = o.access / o.bytes;  // an access's
    Reg row = b.mad(Type::u32, warp, kir::imm_u32(rows_at_once), b.div(Type::u32, lane, kir::imm_u32(lanes)));
    Reg col =
        b.mul(Type::u32, b.rem(Type::u32, lane, kir::imm_u32(lanes)), kir::imm_u32(static_cast<uint32_t>(elements)));
    Reg from = b.mad(Type::u32, row, kir::imm_u32(o.pitch),
                     b.mad(Type::u32, col, kir::imm_u32(o.bytes), b.add(Type::u32, smem_, kir::imm_u32(o.offset))));
    Reg to = b.address(tile[r], b.mad(it, widen(row), imm_index(it, out_row_), widen(col)), static_cast<int>(o.bytes));
    const Type t = o.access == 16 ? Type::u32 : o.bytes == 4 ? Type::f32 : Type::bf16;  // bf16 moves as its bits
    const int vec = o.access == 16 ? 4 : 1;
    const int64_t row_step = int64_t{warps_} * rows_at_once,
                  per_lane = tn_ / elements / lanes;  // a row's accesses a lane
    for (int64_t i = 0; i * row_step < tm_; ++i) {
      // A row group's accesses are loaded before their stores, so that the loads are in flight together.
      std::vector<std::vector<Reg>> values;
      for (int64_t j = 0; j < per_lane; ++j)
        values.push_back(b.ld_vec(Space::shared, t, from, vec, i * row_step * o.pitch + j * lanes * o.access));
      for (int64_t j = 0; j < per_lane; ++j) {
        const std::vector<Reg>& v = values[static_cast<size_t>(j)];
        const int64_t at = (i * row_step * out_row_ + j * lanes * elements) * o.bytes;
        if (vec == 1)
          b.st(Space::global, t, to, v[0], at);
        else
          b.st_vec(Space::global, t, to, {v[0], v[1], v[2], v[3]}, at);
      }
    }
  }
}

}  // namespace kiln::cuda
