// The bf16 mma.sync matmul kernel's layouts, tiling and main loop (matmul_bf16_mma.hpp): the
// operands' tiles in 2-4 cp.async stages laid out as each is stored, fragments by ldmatrix,
// mma.sync m16n8k16 into the tf32 kernel's accumulator layout.
#include "cuda/lower/matmul_bf16_mma.hpp"

#include <algorithm>
#include <functional>

#include "circuit/ir/options.hpp"
#include "cuda/lower/util.hpp"

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_u32;

namespace {

// Operand `stored` read through view v: its stage layout, or nothing where the kernel cannot
// copy it in 16-byte chunks.
std::optional<Bf16Stage> bf16_stage(const Circuit& c, ValueId stored, const MatmulOperand& v) {
  if (c.info(stored).dtype != DType::bf16 || v.offset % 8 != 0) return std::nullopt;
  for (int64_t s : v.batch)
    if (s % 8 != 0) return std::nullopt;
  if (v.k_stride == 1 && v.row_stride % 8 == 0) return Bf16Stage::row_k;
  if (v.row_stride == 1 && v.k_stride % 8 == 0) return Bf16Stage::k_row;
  return std::nullopt;
}

}  // namespace

MmaTiling choose_mma_tiling(const std::array<Bf16Stage, 2>& layout) {
  MmaTiling t;
  if (const int tn = options::mma_tile_n(); tn != 0) t.tn = tn;
  if (const int stages = options::mma_stages(); stages != 0) t.stages = stages;
  const int64_t per_stage = stage_bytes(layout[0], 128) + stage_bytes(layout[1], t.tn);
  while (t.stages > 2 && t.stages * per_stage > kir::kMaxSharedBytes) --t.stages;
  return t;
}

int64_t choose_splits(int64_t blocks, int64_t K, const MmaTiling& tiling) {
  const int64_t steps = (K + kMmaTileK - 1) / kMmaTileK;
  const int setting = options::mma_split_k();
  if (setting > 0) return std::min<int64_t>(setting, steps);
  if (setting == 0) return 1;
  const int64_t slots = (tiling.tn == 128 ? 2 : 1) * kAssumedSms;
  if (2 * blocks > slots) return 1;
  return std::clamp<int64_t>(std::min(slots / std::max<int64_t>(blocks, 1), steps / 8), 1, 4);
}

std::optional<std::array<Bf16Stage, 2>> bf16_mma_stages(const Circuit& c, const Op& op, const FusedMatmul& f) {
  if (!options::bf16_mma() || f.a_row_sums) return std::nullopt;
  const std::optional<Bf16Stage> a = bf16_stage(c, op.inputs[0], f.a), b = bf16_stage(c, op.inputs[1], f.b);
  if (!a || !b) return std::nullopt;
  return std::array<Bf16Stage, 2>{*a, *b};
}

void bf16_mma_main_loop(KernelBuilder& b, Type it, std::array<Reg, 2> base, std::array<const MatmulOperand*, 2> view,
                        std::array<Bf16Stage, 2> layout, const MmaTiling& tiling, std::array<int64_t, 2> rows,
                        int64_t K, kir::Operand k_begin, kir::Operand k_end, std::array<Reg, 2> row0, Reg tid,
                        std::array<Reg, 2> smem, Reg warp_m, Reg warp_n, std::vector<Reg>& acc) {
  auto widen = [&](Reg r) { return it == Type::u32 ? r : b.cvt(Type::u64, r); };
  const std::array<int, 2> tile_rows{128, tiling.tn};
  const std::array<uint32_t, 2> pitch{stage_pitch_bytes(layout[0], tile_rows[0]),
                                      stage_pitch_bytes(layout[1], tile_rows[1])},
      bytes{stage_bytes(layout[0], tile_rows[0]), stage_bytes(layout[1], tile_rows[1])};
  // Where chunk `chunk` (of 8 k) of row `row` sits in a [row][k] stage.
  auto swizzled = [&](Reg row, Reg chunk) {
    Reg flip = b.and_(Type::u32, b.shr(Type::u32, row, imm_u32(1)), imm_u32(3));
    return b.mad(Type::u32, row, imm_u32(stage_pitch_bytes(Bf16Stage::row_k, 0)),
                 b.mul(Type::u32, b.xor_(Type::u32, chunk, flip), imm_u32(16)));
  };
  // Stage loads: operand o's rows x 32 tile is 4 rows chunks of 16 bytes; thread t copies chunks
  // t, t + 256, ... [row][k]: chunk c is row c / 4, k 8 (c % 4) .. + 7. [k][row]: chunk c is k
  // c / (rows / 8), rows 8 (c % (rows / 8)) .. + 7. Elements past the matrix are zero-filled
  // (the copy reads only the bytes inside it). stage[o]: the byte offset of the stage filled.
  auto issue = [&](Reg k0, std::array<Reg, 2> stage) {
    for (size_t o = 0; o < 2; ++o) {
      const auto row_chunks = static_cast<uint32_t>(tile_rows[o] / 8);
      for (uint32_t s = 0; s < static_cast<uint32_t>(tile_rows[o]) * 4 / kMmaThreads; ++s) {
        Reg chunk = s == 0 ? tid : b.add(Type::u32, tid, imm_u32(s * kMmaThreads));
        const bool row_k = layout[o] == Bf16Stage::row_k;
        Reg r = row_k ? b.shr(Type::u32, chunk, imm_u32(2))
                      : b.mul(Type::u32, b.rem(Type::u32, chunk, imm_u32(row_chunks)), imm_u32(8));
        Reg kc = row_k ? b.and_(Type::u32, chunk, imm_u32(3)) : b.div(Type::u32, chunk, imm_u32(row_chunks));
        Reg grow = b.add(it, row0[o], widen(r));
        Reg gk = b.add(it, k0, widen(row_k ? b.mul(Type::u32, kc, imm_u32(8)) : kc));
        Reg ok =
            b.and_(Type::pred, b.setp(Cmp::lt, grow, imm_index(it, rows[o])), b.setp(Cmp::lt, gk, imm_index(it, K)));
        // The chunk's elements inside the matrix, 2 bytes each: min(K - gk, 8) along k, min(rows
        // - grow, 8) along rows; the copy zero-fills the rest.
        Reg left = row_k ? b.min(it, b.sub(it, imm_index(it, K), gk), imm_index(it, 8))
                         : b.min(it, b.sub(it, imm_index(it, rows[o]), grow), imm_index(it, 8));
        if (it != Type::u32) left = b.cvt(Type::u32, left);
        Reg copied = b.selp(Type::u32, b.mul(Type::u32, left, imm_u32(2)), imm_u32(0), ok);
        Reg at =
            row_k ? scaled_add(b, it, grow, view[o]->row_stride, gk) : scaled_add(b, it, gk, view[o]->k_stride, grow);
        Reg src = b.selp(Type::u64, b.address(base[o], at, 2), base[o], ok);
        Reg dst = row_k ? b.add(Type::u32, swizzled(r, kc), smem[o])
                        : b.mad(Type::u32, kc, imm_u32(pitch[o]), b.mad(Type::u32, r, imm_u32(2), smem[o]));
        b.cp_async(b.add(Type::u32, dst, stage[o]), src, 16, copied);
      }
    }
  };
  // ldmatrix.x4 loads four 8x8 matrices, lanes 8j .. 8j + 7 giving the shared addresses of matrix
  // j's 8 rows. A (16 rows x 16 k; a0a1, a2a3, a4a5, a6a7): matrix j covers rows 8 (j % 2), k
  // 8 (j / 2); B (two n8 tiles x 16 k; b0b1, b2b3 of each): rows 8 (j / 2), k 8 (j % 2). A lane's
  // address is row (low) of its matrix for [row][k] stages, k (low) with .trans for [k][row].
  // lane_at[o][h]: operand o's lane address for the k half h (k 16 h .. + 15) of a step.
  Reg lane = b.and_(Type::u32, tid, imm_u32(31));
  Reg low = b.and_(Type::u32, lane, imm_u32(7)),
      mid = b.and_(Type::u32, b.shr(Type::u32, lane, imm_u32(3)), imm_u32(1)),
      high = b.shr(Type::u32, lane, imm_u32(4));
  auto lane_address = [&](size_t o, Reg warp_row, Reg row_part, Reg k_part, uint32_t h) {
    Reg row = b.add(Type::u32, warp_row, b.mul(Type::u32, row_part, imm_u32(8)));
    Reg chunk = b.add(Type::u32, k_part, imm_u32(2 * h));  // of 8 k
    if (layout[o] == Bf16Stage::row_k) return b.add(Type::u32, swizzled(b.add(Type::u32, row, low), chunk), smem[o]);
    Reg k = b.mad(Type::u32, chunk, imm_u32(8), low);
    return b.mad(Type::u32, k, imm_u32(pitch[o]), b.mad(Type::u32, row, imm_u32(2), smem[o]));
  };
  const std::array<std::array<Reg, 2>, 2> lane_at{
      std::array<Reg, 2>{lane_address(0, warp_m, mid, high, 0), lane_address(0, warp_m, mid, high, 1)},
      std::array<Reg, 2>{lane_address(1, warp_n, high, mid, 0), lane_address(1, warp_n, high, mid, 1)}};
  // Rows 16 i further on (the swizzle repeats every 8 rows).
  auto fragments = [&](size_t o, Reg stage, uint32_t h, uint32_t i) {
    const uint32_t rows_on = layout[o] == Bf16Stage::row_k ? i * 16 * pitch[o] : i * 16 * 2;
    return b.ldmatrix(4, layout[o] == Bf16Stage::k_row,
                      b.add(Type::u32, b.add(Type::u32, lane_at[o][h], stage), imm_u32(rows_on)));
  };
  const auto n_tiles = static_cast<size_t>(tiling.warp_n_tiles());
  auto compute = [&](std::array<Reg, 2> stage) {
    for (uint32_t h = 0; h < kMmaTileK / 16; ++h) {
      std::vector<std::vector<kir::Operand>> fa(4), fb(n_tiles);
      for (uint32_t mi = 0; mi < 4; ++mi)
        for (Reg r : fragments(0, stage[0], h, mi)) fa[mi].push_back(r);
      for (uint32_t nj = 0; nj < n_tiles / 2; ++nj) {
        const std::vector<Reg> m = fragments(1, stage[1], h, nj);
        fb[2 * nj] = {m[0], m[1]};
        fb[2 * nj + 1] = {m[2], m[3]};
      }
      for (size_t mi = 0; mi < 4; ++mi)
        for (size_t ni = 0; ni < n_tiles; ++ni) {
          const size_t at = (mi * n_tiles + ni) * 4;
          const std::vector<kir::Operand> c(acc.begin() + static_cast<std::ptrdiff_t>(at),
                                            acc.begin() + static_cast<std::ptrdiff_t>(at + 4));
          const std::vector<Reg> d = b.mma(kir::MmaShape::m16n8k16_bf16, fa[mi], fb[ni], c);
          for (size_t i = 0; i < 4; ++i) b.set(acc[at + i], d[i]);
        }
    }
  };
  // The stage after `stage` (byte offsets, stage s of operand o at s * bytes[o]), cycling.
  const auto stages = static_cast<uint32_t>(tiling.stages);
  auto advance = [&](std::array<Reg, 2> stage) {
    for (size_t o = 0; o < 2; ++o) {
      Reg next = b.add(Type::u32, stage[o], imm_u32(bytes[o]));
      b.set(stage[o], b.selp(Type::u32, imm_u32(0), next, b.setp(Cmp::eq, next, imm_u32(stages * bytes[o]))));
    }
  };
  auto offsets = [&](uint32_t s) {
    return std::array<Reg, 2>{b.mov(Type::u32, imm_u32(s * bytes[0])), b.mov(Type::u32, imm_u32(s * bytes[1]))};
  };
  const std::array<Reg, 2> read = offsets(0);  // the stage computed on
  // Emits `issue_step` where the step `ahead` k past k_begin lies before k_end: decided here
  // when both are immediates (no split), in the kernel otherwise.
  auto if_step = [&](int64_t ahead, const std::function<void()>& issue_step) {
    if (k_begin.is_imm && k_end.is_imm) {
      if (static_cast<int64_t>(k_begin.bits) + ahead < static_cast<int64_t>(k_end.bits)) issue_step();
      return;
    }
    b.if_(b.setp(Cmp::lt, b.add(it, k_begin, imm_index(it, ahead)), k_end), issue_step);
  };
  auto k_at = [&](int64_t ahead) { return ahead == 0 ? b.mov(it, k_begin) : b.add(it, k_begin, imm_index(it, ahead)); };
  if (stages == 2) {
    // Two stages: the next step's copies are issued before this step's wait, so they are in
    // flight during it and the arithmetic; a second barrier keeps them off the stage until every
    // warp is done with it.
    if_step(0, [&] { issue(k_at(0), read); });
    b.cp_async_commit();
    b.for_(k_begin, k_end, imm_index(it, kMmaTileK), [&](Reg k0) {
      Reg next = b.add(it, k0, imm_index(it, kMmaTileK));
      const std::array<Reg, 2> other{b.xor_(Type::u32, read[0], imm_u32(bytes[0])),
                                     b.xor_(Type::u32, read[1], imm_u32(bytes[1]))};
      b.if_(b.setp(Cmp::lt, next, k_end), [&] { issue(next, other); });
      b.cp_async_commit();  // possibly empty: the group count stays one a step
      b.cp_async_wait(1);   // this step's stage has landed
      b.bar();
      compute(read);
      b.bar();  // every warp is done with this stage before the next step's copies refill it
      for (size_t o = 0; o < 2; ++o) b.set(read[o], other[o]);
    });
  } else {
    // S stages, one barrier a step: steps 0 .. S - 2 are issued first; step i waits for its
    // own group (S - 2 younger ones may stay in flight), meets the barrier (after which every
    // warp is done with step i - 1's stage), refills that stage with step i + S - 1, computes.
    for (uint32_t s = 0; s + 1 < stages; ++s) {
      if_step(int64_t{s} * kMmaTileK, [&] { issue(k_at(int64_t{s} * kMmaTileK), offsets(s)); });
      b.cp_async_commit();  // possibly empty
    }
    const std::array<Reg, 2> write = offsets(stages - 1);  // the stage refilled
    b.for_(k_begin, k_end, imm_index(it, kMmaTileK), [&](Reg k0) {
      b.cp_async_wait(static_cast<int>(stages) - 2);
      b.bar();
      Reg ahead = b.add(it, k0, imm_index(it, static_cast<int64_t>(stages - 1) * kMmaTileK));
      b.if_(b.setp(Cmp::lt, ahead, k_end), [&] { issue(ahead, write); });
      b.cp_async_commit();  // possibly empty: one group a step
      compute(read);
      advance(read);
      advance(write);
    });
  }
  b.cp_async_wait(0);
}

}  // namespace kiln::cuda
