// The tensor-core matmul kernel's choices (matmul_mma.hpp): which operands it takes and their
// stage layouts, its tiling, stages and K splits, and the operands' tensor maps. Its main loop is
// matmul_mma_loop.cpp.
#include <algorithm>
#include <tuple>
#include <utility>

#include <kiln/cuda/lower/matmul_mma.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

namespace {

// Operand `stored` read through view v: its stage layout for `input`, or nothing where the kernel
// cannot copy it as it is in 16-byte chunks (8 bf16 or 4 f32 elements).
std::optional<MmaStage> stage_of(const Circuit& c, ValueId stored, const MatmulOperand& v, MmaInput input) {
  const DType dtype = input == MmaInput::bf16 ? DType::bf16 : DType::f32;
  const int64_t chunk = 16 / element_bytes(input);
  if (c.info(stored).dtype != dtype || v.prologue != se::in(0) || v.offset % chunk != 0) return std::nullopt;
  for (int64_t s : v.batch)
    if (s % chunk != 0) return std::nullopt;
  if (v.k_stride == 1 && v.row_stride % chunk == 0) return MmaStage::row_k;
  if (v.row_stride == 1 && v.k_stride % chunk == 0) return MmaStage::k_row;
  return std::nullopt;
}

}  // namespace

namespace {

// tile=waves on wgmma (to be timed in GPT-2's step): the tile whose grid takes the
// least time in whole waves of kAssumedSms blocks (at 4 stages each tile takes one block an SM),
// a wave of 128x256 blocks costing 1.6 of 128x128 ones (H100, 4096^3 on wgmma: 63 against 39 us
// a wave) and one of 192x256 blocks 2.4 (their 1.5x the product at 128x256's rate a FLOP, not
// yet timed; their higher FLOP a byte of L2 would make it less). Ties keep the smaller tile.
// - GPT-2's MLP weight gradients, 768 x 3072 over 8192 tokens: 72 blocks of 128x256 (one wave,
//   1.6) against 144 of 128x128 (two waves, 2) and 48 of 192x256 (2.4), so 128x256, which took
//   0.098 ms against 0.135 alone; auto takes 128x128 (72 blocks do not fill the SMs).
// - GPT-2's x W of 8192 x 768 outputs: 129 blocks of 192x256 (one wave, 2.4) against 192 of
//   128x256 (two, 3.2) and 384 of 128x128 (three, 3); its QKV (8192 x 2304): 387 blocks of
//   192x256 (three waves, 7.2) against 576 of 128x256 (five, 8).
// `blocks_192` 0: no 192-row tiles (products with block sums). On mma.sync, whose 128x128 blocks
// fit two an SM, waves takes auto's tile. Returns the tile's rows and columns.
std::pair<int, int> wave_tile(int64_t blocks_128, int64_t blocks_256, int64_t blocks_192) {
  auto waves = [](int64_t blocks) { return (blocks + kAssumedSms - 1) / kAssumedSms; };
  std::pair<int, int> tile{128, 128};
  int64_t cost = 10 * waves(blocks_128);  // tenths of a 128x128 wave
  if (16 * waves(blocks_256) < cost) tile = {128, 256}, cost = 16 * waves(blocks_256);
  if (blocks_192 > 0 && 24 * waves(blocks_192) < cost) tile = {192, 256};
  return tile;
}

}  // namespace

MmaTiling choose_mma_tiling(const std::array<MmaStage, 2>& layout, MmaInput input, int64_t blocks_128,
                            int64_t blocks_256, int64_t blocks_192, const Target& target) {
  const MatmulPolicy& policy = target.matmul;
  MmaTiling t;
  t.input = input;
  t.wgmma = input == MmaInput::bf16 && target.wgmma();
  // Unset: auto on wgmma (timed in GPT-2's step on an H100: 33.95 and 33.87 ms against 33.97
  // and 34.37 unsplit), none on mma.sync (its one timing, with auto tiles, was not separated).
  t.split_k = policy.split_k.value_or(t.wgmma ? -1 : 0);
  t.staging = policy.staged_stores;
  t.products_first = policy.products_first;
  t.tensor_copies = policy.tensor_copies;
  const int tile = policy.tile_n;  // > 0 a size, kTileAuto, kTileWaves, 0 unset
  if (tile > 0)
    t.tn = tile;
  else if (tile == MatmulPolicy::kTileWaves && t.wgmma)
    std::tie(t.tm, t.tn) = wave_tile(blocks_128, blocks_256, blocks_192);
  else if (tile < 0 || t.wgmma)  // auto (waves on mma.sync, whose 128x128 blocks fit two an SM, too)
    t.tn = blocks_256 >= kAssumedSms ? 256 : 128;
  if (t.wgmma && policy.tile_m == 192) t.tm = 192;
  if (policy.stages != 0) t.stages = policy.stages;
  if (t.wgmma) t.stages = policy.stages == 0 ? 4 : std::max(t.stages, 3);
  const int64_t limit = t.wgmma ? kir::kMaxSharedBytesSm90a : kir::kMaxSharedBytes;
  while (t.stages > (t.wgmma ? 3 : 2) && mma_shared_bytes(layout, t) > limit) --t.stages;
  return t;
}

int64_t mma_shared_bytes(const std::array<MmaStage, 2>& layout, const MmaTiling& tiling) {
  const int64_t stages =
      int64_t{tiling.stages} * (tiling.stage_bytes(layout[0], tiling.tm) + tiling.stage_bytes(layout[1], tiling.tn));
  return tiling.wgmma ? stages + 1024 : stages;
}

int64_t choose_splits(int64_t blocks, int64_t K, const MmaTiling& tiling) {
  const int64_t steps = (K + tiling.tile_k() - 1) / tiling.tile_k();
  const int setting = tiling.split_k;
  if (tiling.tm != 128) return 1;  // the last block's walk of the tile takes tn | threads: 128-row tiles
  if (setting > 0) return std::min<int64_t>(setting, steps);
  if (setting == 0) return 1;
  // Blocks an SM holds: two 128x128 mma.sync blocks; wgmma's as many as its 227 KiB take.
  const int64_t per_sm =
      tiling.wgmma
          ? std::clamp<int64_t>(kir::kMaxSharedBytesSm90a /
                                    (tiling.stages * tiling.stage_bytes(MmaStage::row_k, 128 + tiling.tn) + 1024),
                                1, 2)
          : (tiling.tn == 128 ? 2 : 1);
  const int64_t slots = per_sm * kAssumedSms;
  if (2 * blocks > slots) return 1;
  return std::clamp<int64_t>(std::min(slots / std::max<int64_t>(blocks, 1), steps / 8), 1, 4);
}

bool use_wgmma_tensor_copies(const MmaTiling& tiling, bool batched, std::array<const MatmulOperand*, 2> view,
                             std::array<MmaStage, 2> layout, int64_t M, int64_t N, int64_t K) {
  constexpr int64_t kMostCoordinate = int64_t{1} << 31;  // the copies' coordinates are s32
  for (size_t o = 0; o < 2; ++o)
    if ((layout[o] == MmaStage::row_k ? view[o]->row_stride : view[o]->k_stride) <= 0) return false;
  return tiling.wgmma && tiling.tensor_copies && !batched && K > 0 && M + 256 < kMostCoordinate &&
         N + 256 < kMostCoordinate && K + kWgmmaTileK < kMostCoordinate;
}

TensorMapArg wgmma_tensor_map(int o, const MatmulOperand& v, MmaStage layout, const MmaTiling& tiling, int64_t rows,
                              int64_t K) {
  TensorMapArg m;
  m.input = o;
  m.element_bytes = 2;
  m.offset = v.offset;
  const auto tile_rows = static_cast<uint32_t>(o == 0 ? tiling.tm : tiling.tn);
  if (layout == MmaStage::row_k) {
    m.dims = {static_cast<uint64_t>(K), static_cast<uint64_t>(rows)};
    m.strides = {static_cast<uint64_t>(v.row_stride) * 2};
    m.box = {kWgmmaTileK, tile_rows};
  } else {
    m.dims = {static_cast<uint64_t>(rows), static_cast<uint64_t>(K)};
    m.strides = {static_cast<uint64_t>(v.k_stride) * 2};
    m.box = {64, kWgmmaTileK};
  }
  return m;
}

std::optional<std::array<MmaStage, 2>> mma_stage_layouts(const Circuit& c, const Op& op, const FusedMatmul& f,
                                                         MmaInput input, const Target& target) {
  if ((input == MmaInput::bf16 && !target.matmul.bf16_mma) || f.a_row_sums) return std::nullopt;
  const std::optional<MmaStage> a = stage_of(c, op.inputs[0], f.a, input), b = stage_of(c, op.inputs[1], f.b, input);
  if (!a || !b) return std::nullopt;
  return std::array<MmaStage, 2>{*a, *b};
}

}  // namespace kiln::cuda
