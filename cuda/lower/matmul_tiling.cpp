// The matmul lowering's tiling policy, and the FFMA kernel's operand tiles (matmul.hpp). Every
// choice the kernel makes before it emits anything is here, put together by plan_matmul: the
// batch dims folded into the rows (fold_batch_into_rows), the kernel path, the FFMA kernels'
// tiles (choose_tiling), the tensor-core kernel's choices (which operands it takes and their stage
// layouts, its tiling, stages and K splits, tensor copies and the operands' tensor maps), and the
// index type. The tensor-core kernel's main loop is matmul_mma_loop.cpp; the kernel that reads
// the plan, matmul.cpp. Last, the FFMA kernel's operand tiles (TileLoader).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/lower/elementwise.hpp>
#include <kiln/cuda/lower/matmul.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

using kir::Cmp;
using kir::imm_f32;
using kir::imm_u32;
using kir::Space;

namespace {

constexpr int kThreads = kMatmulThreads;
using Tiling = MatmulTiling;
constexpr Tiling kSmallTile{64, 64, 4, 4}, kLargeTile{128, 128, 8, 8}, kTf32Tile{128, 128, 8, 8, true, 8};
// 128x128 tiles take 120-150 registers a thread (ptxas, sm_90); those without a prologue or row
// sums ask for two blocks an SM (.minnctapersm 2, 128 registers; see
// MatmulKernel::finish, matmul.cpp), the others may run one an SM. They are taken where their grid fills at least
// kLargeTileMinWaveFill of the waves it needs: measured on an H100 (docs/BENCHMARKS.md), 128x128 tiles are about 10%
// faster than 64x64 on full waves, but a grid of 144 blocks (1.09 waves) ran at 0.74x the 64x64 rate. The lowering does
// not know the device; kAssumedSms is an H100's count.
constexpr int64_t kLargeTileMinBlocks = 128;
constexpr double kLargeTileMinWaveFill = 0.8;

// bf16 operands take the tensor cores whenever the tiles are large, whatever Target::tf32 says:
// a bf16 value is a tf32 value, so the tf32 mma multiplies them exactly (as a bf16 mma would).
// Block sums (FusedMatmul::block_sums, 128-row blocks) take 128-row tiles whatever the grid.
Tiling choose_tiling(int64_t m, int64_t n, int64_t batch, bool bf16_operands, bool block_sums, const Target& target) {
  const bool tf32 = target.tf32 || bf16_operands;
  if (block_sums) return tf32 ? kTf32Tile : kLargeTile;
  const int forced = target.matmul.simt_tile;
  if (forced != 0) return forced == 128 ? (tf32 ? kTf32Tile : kLargeTile) : kSmallTile;
  const int64_t large_blocks = (m + 127) / 128 * ((n + 127) / 128) * batch;
  const int64_t waves = (large_blocks + kAssumedSms - 1) / kAssumedSms;
  const bool fills_waves =
      static_cast<double>(large_blocks) >= kLargeTileMinWaveFill * static_cast<double>(waves * kAssumedSms);
  if (!(large_blocks >= kLargeTileMinBlocks && fills_waves)) return kSmallTile;
  return tf32 ? kTf32Tile : kLargeTile;
}

}  // namespace

namespace {

// Batch dims along which the rows of a, of the output and of every extra continue (each item's
// rows right after the previous item's), with b the same for every item, as in a linear layer's x
// W over [B, T, C] activations: folded into the rows, innermost first. One product of B T rows
// then fills its row tiles across items instead of rounding each item's T rows up to whole tiles
// (T = 64 filled half of each 128-row tile; 1024 rows take 6 tiles of 192 for 5.33). Not with
// row sums or block sums, which are laid out per item, nor past rows that 64-row tiles would
// count beyond the grid's 65535 (grid z takes the batch then). Dims of size 1 index nothing and
// go. `extra_strides`: each extra's strides against the logical domain, folded the same.
FusedMatmul fold_batch_into_rows(FusedMatmul f, std::vector<std::vector<int64_t>>& extra_strides) {
  if (f.a_row_sums || f.block_sums) return f;
  constexpr int64_t kMostRows = int64_t{65535} * 64;
  while (!f.batch.empty()) {
    const size_t d = f.batch.size() - 1;
    bool folds = f.batch[d] == 1;
    if (!folds) {
      folds = f.a.batch[d] == f.m * f.a.row_stride && f.b.batch[d] == 0 && f.out_batch[d] == f.m * f.out_row &&
              f.m * f.batch[d] <= kMostRows;
      for (const std::vector<int64_t>& st : extra_strides) folds = folds && st[d] == f.m * st[d + 1];
    }
    if (!folds) break;
    f.m *= f.batch[d];
    for (std::vector<int64_t>* strides : {&f.batch, &f.a.batch, &f.b.batch, &f.out_batch}) strides->pop_back();
    for (std::vector<int64_t>& st : extra_strides) st.erase(st.begin() + static_cast<std::ptrdiff_t>(d));
  }
  return f;
}

}  // namespace

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

// The plan (MatmulPlan, matmul.hpp): the choices above put together.
MatmulPlan plan_matmul(const Circuit& c, const Op& op, const FusedMatmul& program, const Target& target) {
  MatmulPlan p;
  std::vector<std::vector<int64_t>>& extra_strides = p.extra_strides;
  for (int j = 0; j < program.extras; ++j)
    extra_strides.push_back(broadcast_strides(c.info(op.inputs[static_cast<size_t>(2 + j)]).shape, program.logical()));
  p.f = fold_batch_into_rows(program, extra_strides);
  const FusedMatmul& f = p.f;
  p.M = f.m, p.N = f.n, p.K = f.k;
  const int64_t M = p.M, N = p.N, K = p.K;
  const Shape logical = f.logical();
  const Shape batch_shape(f.batch);
  p.nb = static_cast<int>(f.batch.size());
  const int nb = p.nb;
  p.batch = batch_shape.numel();
  const int64_t batch = p.batch;
  // bf16 values: stored as bf16, or f32 read through a rounding to bf16 (a cast fused in).
  const ScalarExp rounded = se::round_bf16(se::in(0));
  auto bf16_valued = [&](int i, const MatmulOperand& v) {
    return c.info(op.inputs[static_cast<size_t>(i)]).dtype == DType::bf16 || v.prologue == rounded;
  };
  p.bf16_values = bf16_valued(0, f.a) && bf16_valued(1, f.b);
  // The cp.async mma kernel (matmul.hpp): bf16 operands stored as bf16, or with tf32 allowed
  // f32 operands stored as f32 (unless 64x64 tiles are forced), each read as stored. Whatever the
  // grid: a tensor-core block does about 5x the work of an FFMA block in the same time (and two
  // 128x128 blocks fit on an SM), so even grids too small for the FFMA kernels' large tiles gain
  // (a weight gradient of 144 blocks: 1.3 ms in 64x64 FFMA tiles on an H100).
  p.mma_input = MmaInput::bf16;
  std::optional<std::array<MmaStage, 2>>& mma_stages = p.mma_stages;
  mma_stages = mma_stage_layouts(c, op, f, MmaInput::bf16, target);
  if (!mma_stages && target.tf32 && target.matmul.simt_tile != 64) {
    p.mma_input = MmaInput::tf32;
    mma_stages = mma_stage_layouts(c, op, f, MmaInput::tf32, target);
  }
  p.cp_async_mma = mma_stages.has_value();  // the cp.async mma kernel, either input
  const bool cp_async_mma = p.cp_async_mma;
  MmaTiling& mma = p.mma;
  mma = cp_async_mma ? choose_mma_tiling(*mma_stages, p.mma_input, (M + 127) / 128 * ((N + 127) / 128) * batch,
                                         (M + 127) / 128 * ((N + 255) / 256) * batch,
                                         f.block_sums ? 0 : (M + 191) / 192 * ((N + 255) / 256) * batch, target)
                     : MmaTiling{};
  if (f.block_sums) mma.tm = 128;  // the sums are of 128-row blocks
  p.threads = cp_async_mma ? mma.threads() : kThreads;
  // The mma tiles' accumulators: pm x pn = tm x tn / threads a thread (128 x tn / 256, or 128 in
  // 192x256 tiles), as 4 x tn / 32 products of 16x8 (mma.sync) or one m64n{tn} product (wgmma).
  p.tile = cp_async_mma ? Tiling{mma.tm, mma.tn, 8, mma.tn / 16, true, 8}
                        : choose_tiling(M, N, batch, p.bf16_values, f.block_sums, target);
  const Tiling tile = p.tile;
  p.grid_m = (M + tile.tm - 1) / tile.tm, p.grid_n = (N + tile.tn - 1) / tile.tn;
  const int64_t grid_m = p.grid_m, grid_n = p.grid_n;
  // Split-K: `splits` blocks per output tile (grid z = batch x splits), block s over k in
  // [s k_split, min((s + 1) k_split, K)) with k_split a whole number of steps; each writes its
  // partial tile to scratch, and the tile's last block to arrive adds the partials in split order
  // (no float atomics: the same sums whatever the scheduling) and applies the epilogue.
  // (K = 0: no split; the loop runs no step and the epilogue stores zeros. Grid z stays within
  // its 65535: fewer splits where the batch needs them.)
  int64_t& splits = p.splits;
  splits = cp_async_mma && K > 0 ? choose_splits(grid_m * grid_n * batch, K, mma) : 1;
  splits = std::clamp<int64_t>(std::min(splits, 65535 / std::max<int64_t>(batch, 1)), 1, 4);
  p.k_split = std::max<int64_t>(1, (K + splits * mma.tile_k() - 1) / (splits * mma.tile_k())) * mma.tile_k();
  splits = std::max<int64_t>(1, (K + p.k_split - 1) / p.k_split);  // none empty
  if (batch > 65535 || grid_m > 65535)
    fail(op.prim->name, op.scope,
         "batch " + std::to_string(batch) + " or " + std::to_string(grid_m) +
             " row tiles exceed the grid's y/z limit of 65535");
  int64_t largest = std::max(logical.numel(), splits > 1 ? batch * splits * M * N : 0);  // the partials
  for (ValueId v : op.inputs) largest = std::max(largest, c.info(v).shape.numel());
  p.it = index_type(target, largest);

  // wgmma stages filled by tensor copies (opt-in, products without a batch): the operands' maps
  // are parameters after the others.
  p.tensor_copies = cp_async_mma && use_wgmma_tensor_copies(mma, nb > 0, {&f.a, &f.b}, *mma_stages, M, N, K);
  return p;
}

// The FFMA-tile matmul kernel's operand tiles (TileLoader).

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
