// The bf16 mma.sync matmul kernel's pieces (matmul_bf16_mma.cpp), which the matmul lowering
// (fused_matmul.cpp) puts around its prologue and epilogue. Internal to cuda/lower/.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "circuit/prims/fused_matmul.hpp"
#include "cuda/lower/lower.hpp"
#include "cuda/lower/util.hpp"

namespace kiln::cuda {

// The lowering does not know the device: grid sizes are judged against an H100's SM count.
constexpr int64_t kAssumedSms = 132;
constexpr int kMmaThreads = 256;  // a block: 8 warps

// The bf16 mma.sync kernel (on unless KILN_BF16_MMA=0): block tiles of 128x128 or 128x256
// (KILN_MMA_TILE), k steps of 32, 2-4 shared stages (KILN_MMA_STAGES) filled by cp.async
// (16-byte chunks, zero-filled past the matrix), mma.sync m16n8k16 on 8 warps as 2 x 4, warp
// tiles of 64 x (tn / 4) (64x32: the tf32 kernel's warps and accumulator layout). Each operand's
// stage is laid out as it is stored (Bf16Stage): k contiguous (x W^T, dY W^T) as [row][k],
// fragments by ldmatrix; rows contiguous (x W with W stored [k][n], the weight gradients' X^T dY)
// as [k][row], fragments by ldmatrix.trans. Both need bf16 storage, 16-byte aligned chunks, and
// no row sums.
constexpr int kMmaTileK = 32;
enum class Bf16Stage { row_k, k_row };
// Bytes from one shared row to the next. [row][k]: 64 (a row's 4 chunks of 8 k), the chunks
// swizzled (chunk j of row r at j ^ ((r / 2) % 4)) so that the 8 rows an ldmatrix phase reads,
// and the 8 chunks a cp.async phase writes, fall on the 8 distinct 16-byte groups of the 32
// banks. [k][row]: the row's 2 * rows bytes and 16 more, an odd number of 16-byte groups (17 or
// 33), which does the same for ldmatrix.trans.
constexpr uint32_t stage_pitch_bytes(Bf16Stage s, int rows) {
  return s == Bf16Stage::row_k ? 2 * kMmaTileK : 2 * static_cast<uint32_t>(rows + 8);
}
// One stage of an operand's tile of `rows` rows.
constexpr uint32_t stage_bytes(Bf16Stage s, int rows) {
  return s == Bf16Stage::row_k ? static_cast<uint32_t>(rows) * stage_pitch_bytes(s, rows)
                               : kMmaTileK * stage_pitch_bytes(s, rows);
}
struct MmaTiling {
  int tn = 128;                                 // the block tile's columns (its rows are 128)
  int stages = 2;                               // cp.async stages
  int warp_n_tiles() const { return tn / 32; }  // 16x8 products along n in a warp's tile
};

// KILN_MMA_TILE and KILN_MMA_STAGES (128x128, 2 stages when unset: what was measured on a GPU),
// with the stages cut to what fits in kir::kMaxSharedBytes (128x256 tiles with both operands
// staged [k][row]: 3 of 4).
MmaTiling choose_mma_tiling(const std::array<Bf16Stage, 2>& layout);

// Split-K (KILN_MMA_SPLIT_K): blocks that share an output tile, each over a range of K. "auto":
// where the grid's `blocks` fill fewer than half the block slots of the SMs (two blocks an SM in
// 128x128 tiles, one in 128x256; a weight gradient of 768 x 768 outputs over 8192 tokens has 36
// blocks for 132 SMs), as many splits (up to 4) as fit in those slots, each at least 8 steps of
// K. Forced: that many, at most one a step of K. Returns the splits (1: none).
int64_t choose_splits(int64_t blocks, int64_t K, const MmaTiling& tiling);

// Both operands' stage layouts (operands stored in bf16, k or rows contiguous, 16-byte aligned
// chunks, no row sums, KILN_BF16_MMA not 0), or nothing where the kernel does not apply.
std::optional<std::array<Bf16Stage, 2>> bf16_mma_stages(const Circuit& c, const Op& op, const FusedMatmul& f);

// The bf16 mma kernel's main loop (bf16_mma_stages): operand o's rows row0[o] .. + rows_o - 1
// (128 for a, tiling.tn for b) of rows[o], over k in [k_begin, k_end) in steps of kMmaTileK
// (K in all; a split of K ends at a step boundary or at K, so the copies' zero-fill at K is the
// only one a step needs), into acc as the tf32 kernel lays it out (acc[(mi * warp_n_tiles + ni)
// * 4 + i]: the 16x8 product (mi, ni) of warp tile (warp_m, warp_n)). smem[o] holds
// tiling.stages stages: while one is computed on, cp.async fills the others.
void bf16_mma_main_loop(KernelBuilder& b, Type it, std::array<Reg, 2> base, std::array<const MatmulOperand*, 2> view,
                        std::array<Bf16Stage, 2> layout, const MmaTiling& tiling, std::array<int64_t, 2> rows,
                        int64_t K, kir::Operand k_begin, kir::Operand k_end, std::array<Reg, 2> row0, Reg tid,
                        std::array<Reg, 2> smem, Reg warp_m, Reg warp_n, std::vector<Reg>& acc);

}  // namespace kiln::cuda
