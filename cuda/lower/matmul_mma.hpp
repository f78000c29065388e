// The tensor-core matmul kernel's pieces (its choices: matmul_mma.cpp; its main loop:
// matmul_mma_loop.cpp), which the matmul lowering (fused_matmul.cpp) puts between its prologue
// and its epilogue (matmul_epilogue.cpp). Internal to cuda/lower/.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

// The lowering does not know the device: grid sizes are judged against an H100's SM count.
constexpr int64_t kAssumedSms = 132;
constexpr int kMmaThreads = 256;  // a block: 8 warps

// The cp.async mma.sync kernel: bf16 operands (unless MatmulPolicy::bf16_mma is off; m16n8k16, k steps of
// 32, fragments by ldmatrix) or f32 operands on tf32 tensor cores (Target::tf32; m16n8k8,
// k steps of 16, fragments by scalar shared loads rounded to tf32 in registers). Block tiles of
// 128x128 or 128x256 (MatmulPolicy::tile_n; wgmma also 192x256), 2-4 shared stages (MatmulPolicy::stages) filled by
// cp.async (16-byte chunks, zero-filled past the matrix), 8 warps as 2 x 4, warp tiles of 64 x (tn / 4) (64x32: the
// tf32 FFMA-tile kernel's warps and accumulator layout). Each operand's stage is laid out as it is stored (MmaStage): k
// contiguous (x W^T, dY W^T) as [row][k]; rows contiguous (x W with W stored [k][n], the weight gradients' X^T dY) as
// [k][row] (ldmatrix.trans for bf16). Both need the operand stored in the input's type with 16-byte aligned chunks, no
// prologue, and no row sums. A stage row of k is 64 bytes either way: 32 bf16 or 16 f32.
enum class MmaInput { bf16, tf32 };
enum class MmaStage { row_k, k_row };
constexpr uint32_t element_bytes(MmaInput in) { return in == MmaInput::bf16 ? 2 : 4; }
constexpr int mma_tile_k(MmaInput in) { return in == MmaInput::bf16 ? 32 : 16; }
// Bytes from one shared row to the next. [row][k]: 64 (a row's 4 chunks of 16 bytes), the chunks
// swizzled (chunk j of row r at j ^ ((r / 2) % 4)) so that the 8 rows an ldmatrix phase reads
// (or the 8 rows x 4 words of a tf32 fragment load), and the 8 chunks a cp.async phase writes,
// fall on distinct banks. [k][row]: the row's elements and 8 more, an odd number of 16-byte
// groups (bf16: 17 or 33), or rows of 8 (mod 32) words (f32: 136 or 264), which does the same
// for ldmatrix.trans and for the tf32 fragments (lanes q on 4 k rows, g on 8 words: banks
// 8 q + g).
constexpr uint32_t stage_pitch_bytes(MmaStage s, int rows, MmaInput in) {
  return s == MmaStage::row_k ? 64 : element_bytes(in) * static_cast<uint32_t>(rows + 8);
}
// One stage of an operand's tile of `rows` rows.
constexpr uint32_t stage_bytes(MmaStage s, int rows, MmaInput in) {
  return s == MmaStage::row_k ? static_cast<uint32_t>(rows) * stage_pitch_bytes(s, rows, in)
                              : static_cast<uint32_t>(mma_tile_k(in)) * stage_pitch_bytes(s, rows, in);
}
// sm_90a's wgmma (Target::wgmma(), bf16 only): the same block tiles, k steps of 64, each operand's
// stage in the PTX ISA's 128-byte swizzled canonical layout, which wgmma reads from shared memory
// through matrix descriptors: [row][k] stages K-major (8-row atoms of 1024 bytes, row r's 16-byte
// chunk c at chunk position c ^ (r % 8)), [k][row] stages MN-major (atoms of 64 rows x 8 k, atom
// (p along rows, q along k) at 1024 p + 1024 rows / 64 q, k row j's chunk c at c ^ j). Either is
// 128 bytes a row of the tile. A warpgroup per 64 rows of the tile (two, or three in 192x256
// tiles), each one m64n{tn}k16 product a k16 slice on its rows.
constexpr uint32_t kWgmmaTileK = 64;
constexpr uint32_t wgmma_stage_bytes(int rows) { return static_cast<uint32_t>(rows) * 128; }

struct MmaTiling {
  MmaInput input = MmaInput::bf16;
  int tm = 128;        // the block tile's rows: 128, or 192 (wgmma, 256 columns)
  int tn = 128;        // the block tile's columns
  int stages = 2;      // cp.async stages
  bool wgmma = false;  // products on wgmma (bf16, sm_90a) instead of mma.sync
  // The Target's matmul policy, as the kernel's pieces need it: split-K's setting (0 none, -1
  // auto, 2-4; choose_splits), wgmma's staged stores (matmul_epilogue.cpp), a step's products
  // before its copies (matmul_mma_loop.cpp), stages filled by tensor copies (where they can be).
  int split_k = 0;
  MmaStaging staging = MmaStaging::none;
  bool products_first = false, tensor_copies = false;
  int threads() const { return wgmma ? tm / 64 * 128 : kMmaThreads; }  // a warpgroup per 64 rows
  int warp_n_tiles() const { return tn / 32; }  // mma.sync: 16x8 products along n in a warp's tile
  int tile_k() const { return wgmma ? static_cast<int>(kWgmmaTileK) : mma_tile_k(input); }
  uint32_t stage_bytes(MmaStage s, int rows) const {
    return wgmma ? wgmma_stage_bytes(rows) : kiln::cuda::stage_bytes(s, rows, input);
  }
};

// The Target's matmul policy (MatmulPolicy::tile_m, tile_n, stages; 128x128, 2 stages when
// unset: what was measured on a GPU), with the stages cut to what fits in kir::kMaxSharedBytes
// (128x256 tiles with both operands staged [k][row]: 3 of 4). With wgmma (Target::wgmma(): the
// policy's choice, else a real sm_90 GPU) and bf16 input: 4 stages unless set (2 is raised to 3:
// the pipeline keeps one step's products in flight while it refills the stage before), within
// kir::kMaxSharedBytesSm90a, and auto tiles unless set. tile=auto takes 128x256 tiles for a product of `blocks_256`
// such blocks (batch included) where they fill kAssumedSms (one block an SM: a wave), and 128x128 for smaller grids,
// which 128x256 would leave SMs idle in. (H100, GPT-2 small's bf16 step: mma.sync 45.5 ms at
// 128x128:2, 47.6 at auto:4 with split-K auto; wgmma 37.5 at 128x128:4, 36.0 at auto:4.)
// tile=waves: see wave_tile (matmul_mma.cpp). tile=192x256 (wgmma; else
// 128x256): three warpgroups of 128 threads, 4 stages of 56 KiB; each step's 48 KiB of operands
// in 128x256 tiles feed 4.2 MFLOP (85 FLOP a byte read from L2), 192x256's 56 KiB 6.3 MFLOP (110).
// Products with block sums keep 128 rows (the caller sees to it), and choose_splits takes no split
// of K in 192-row tiles. `blocks_128`, `blocks_256` and `blocks_192`: the product's blocks (batch
// included) in 128x128, 128x256 and 192x256 tiles (0: no 192-row tiles, as for block sums).
MmaTiling choose_mma_tiling(const std::array<MmaStage, 2>& layout, MmaInput input, int64_t blocks_128,
                            int64_t blocks_256, int64_t blocks_192, const Target& target);
// The bytes of shared memory the kernel declares: its stages, and for wgmma 1024 more, so that
// the stages can start at a 1024-byte boundary (the swizzle's atoms) whatever the window gives.
int64_t mma_shared_bytes(const std::array<MmaStage, 2>& layout, const MmaTiling& tiling);

// Split-K (MmaTiling::split_k, from MatmulPolicy::split_k; unset: auto on wgmma, none on mma.sync): blocks that share
// an output tile, each over a range of K. "auto": where the grid's `blocks` fill fewer than half the block slots of the
// SMs (mma.sync: two blocks an SM in 128x128 tiles, one in 128x256; wgmma: as many as fit its shared memory, one or
// two; a weight gradient of 768 x 768 outputs over 8192 tokens has 36 blocks for 132 SMs), as many splits (up to 4) as
// fit in those slots, each at least 8 steps of K. Forced: that many, at most one a step of K. Returns the splits (1:
// none).
int64_t choose_splits(int64_t blocks, int64_t K, const MmaTiling& tiling);

// MatmulPolicy::tensor_copies: wgmma's stages filled by the tensor copy engine instead of
// cp.async, for products without a batch whose sizes fit the copies' s32 coordinates. `maps`: the
// operands' tensor maps (wgmma_tensor_map), `barriers`: the shared address of one mbarrier a stage
// (8 bytes each). An MN-major stage is then its 64-row boxes one after another (8192 bytes each:
// 8 atoms of 8 k) instead of 64-row atoms interleaved along k.
struct WgmmaTensorCopies {
  std::array<Reg, 2> maps;
  Reg barriers;
};
// Whether to: wgmma tiling, the option set, no batch, sizes within s32 coordinates, and each
// operand's outer stride positive (a broadcast operand, stride 0, is no tensor a map describes).
bool use_wgmma_tensor_copies(const MmaTiling& tiling, bool batched, std::array<const MatmulOperand*, 2> view,
                             std::array<MmaStage, 2> layout, int64_t M, int64_t N, int64_t K);
// The tensor map of operand `o` (0: a, rows M; 1: b, rows N) read through view v in `layout`: a
// K-major stage is one box of 64 k x the tile's rows, an MN-major one boxes of 64 rows x 64 k.
TensorMapArg wgmma_tensor_map(int o, const MatmulOperand& v, MmaStage layout, const MmaTiling& tiling, int64_t rows,
                              int64_t K);

// Both operands' stage layouts for `input` (operands stored in its type, k or rows contiguous,
// 16-byte aligned chunks, no prologue, no row sums; bf16: the Target's policy has bf16 mma), or
// nothing where the kernel does not apply.
std::optional<std::array<MmaStage, 2>> mma_stage_layouts(const Circuit& c, const Op& op, const FusedMatmul& f,
                                                         MmaInput input, const Target& target);

// The mma kernel's main loop (mma_stage_layouts): operand o's rows row0[o] .. + rows_o - 1
// (tiling.tm for a, tiling.tn for b) of rows[o], over k in [k_begin, k_end) in steps of tiling.tile_k()
// (K in all; a split of K ends at a step boundary or at K, so the copies' zero-fill at K is the
// only one a step needs), into acc: for mma.sync as the tf32 kernel lays it out (acc[(mi *
// warp_n_tiles + ni) * 4 + i]: the 16x8 product (mi, ni) of warp tile (warp_m, warp_n)); for
// wgmma as D of warpgroup tid / 128 (its rows 64 (tid / 128) .. + 63 of the tile, all tn
// columns; warp_m and warp_n are not read). smem[o] holds tiling.stages stages (for wgmma at
// 1024-byte boundaries): while one is computed on, cp.async fills others.
void mma_main_loop(KernelBuilder& b, Type it, std::array<Reg, 2> base, std::array<const MatmulOperand*, 2> view,
                   std::array<MmaStage, 2> layout, const MmaTiling& tiling, std::array<int64_t, 2> rows, int64_t K,
                   kir::Operand k_begin, kir::Operand k_end, std::array<Reg, 2> row0, Reg tid, std::array<Reg, 2> smem,
                   Reg warp_m, Reg warp_n, std::vector<Reg>& acc, const WgmmaTensorCopies* tensor_copies = nullptr);

}  // namespace kiln::cuda
