// The matmul lowering's internal interface: the GPU kernel that matmul and fused_matmul share,
// declared here and defined in four files:
//  - matmul.cpp: the entry points (lower_matmul, lower_fused_matmul, lower_matmul_program) and
//    the kernel's phases (MatmulKernel): parameters, shared tiles, threads, the FFMA main loops;
//  - matmul_tiling.cpp: the tiling policy, every choice the kernel makes before it emits anything
//    (kernel path, tiles, stages, split-K, stage layouts, tensor copies: plan_matmul,
//    choose_mma_tiling, choose_splits, ...), and the FFMA kernel's operand tiles (make_loader,
//    fetch_tile, store_tile);
//  - matmul_mma_loop.cpp: the tensor-core kernel's main loop (mma_main_loop);
//  - matmul_epilogue.cpp: the epilogue (emit_matmul_epilogue) and wgmma's stores through shared
//    memory (StagedStores).
// Internal to cuda/lower/.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

// ---- The matmul kernel's tiling (MatmulTiling), and the FFMA-tile kernel's operand tiles
// (matmul_tiling.cpp, for matmul.cpp's kernel): a tile of an operand fetched through its view
// into registers, then stored to shared memory with its prologue applied; or, for an f32
// operand stored along its rows, copied into shared memory by cp.async.

constexpr int kMatmulTileK = 16;     // k a step of the FFMA-tile kernel
constexpr int kMatmulThreads = 256;  // threads a block (16 x 16)

// A block's tile of c (tm x tn) and each thread's share (pm x pn, in 4x4 quadrants).
// tf32: tensor cores (mma.sync m16n8k8) instead of FFMAs: 8 warps as 2 x 4, each a 64x32 tile
// of c (4 x 4 products of 16x8), 64 accumulators a thread; shared-memory rows padded by 8
// floats so that a warp's fragment loads (lanes on 8 rows of 4 k) meet no bank conflict. (The
// cp.async mma kernels' tiles are tensor-core tiles too: tf32 set.)
struct MatmulTiling {
  int tm, tn, pm, pn;
  bool tf32 = false;
  int pitch_pad = 0;  // floats after each k's row of a tile in shared memory
};
// FFMA tiles: a thread's rows (and columns) are quadrants of 4, 64 apart.
constexpr int kMatmulQuadrant = 4, kMatmulQuadrantSpacing = 64;
// mma.sync tiles: a warp's tile is kMatmulWarpTileM x (tn / kMatmulWarpsN).
constexpr int kMatmulWarpTileM = 64, kMatmulWarpsN = 4;

// One operand tile: element (row r, k) of the operand's [rows x K] view, stored in shared
// memory as tile[k][r] (tm floats a k) so that a thread's 4 consecutive rows are one 16-byte
// vector. Stores to a tile must spread a warp's 32 lanes over 32 banks, i.e. over 32 rows of
// one k:
//  - an operand with unit stride along its rows: thread t takes row t % tm of k t / tm, and of
//    each k 256 / tm further (as many slots as it takes), and the lanes' loads coalesce. Every
//    slot is on the thread's one row, k_step apart: the registers are slot 0's (row, k, bounds,
//    shared address), and the other slots sit at immediate offsets from its addresses;
//  - otherwise (k_groups): thread t takes row t % tm and groups of 4 consecutive k from
//    4 (t / tm), one group every 4 * 256 / tm k, with one 16-byte load where those 4 are
//    contiguous and 16-byte aligned (vector_k), else 4 scalar loads of one row. (Lanes that
//    walked along k one float each put 16 lanes of a warp on one bank: a 16-way conflict on
//    every tile store.)
// `values` are the registers that carry a fetched tile, as loaded, to its store in shared
// memory, and `oks` whether each was inside the matrix: the prologue, the widening of bf16 and
// the rounding to tf32 are applied as the tile is stored, after the current tile's arithmetic,
// so that nothing waits for the loads before it (applied as they were loaded, a bf16 rounding
// prologue made a weight-gradient kernel 2.3x slower on an H200).
// An f32 operand with unit stride along its rows, no prologue and 16-byte aligned chunks of 4
// rows, in FFMA tiles (not tf32), is instead copied by cp.async (`async`), stored as it is laid
// out ([k][row] both), 16 bytes a copy: thread t takes chunk t % (tm / 4) of k t / (tm / 4), and
// the k 1024 / tm further on (k_step) as its other slots; zero-filled past the matrix. No
// registers carry it: ptxas placed the loads of register-staged tiles after 700-1024 of a k
// step's 1024 FFMAs (docs/BENCHMARKS.md), which left their latency unhidden; a copy is issued
// where the PTX puts it. The caller commits the copies as a group and waits for it before the
// barrier that precedes their reading.
struct TileLoader {
  Reg base;  // the operand's batch base address
  const MatmulOperand* view = nullptr;
  bool k_groups = false, vector_k = false;
  bool async = false;               // copied by cp.async into shared memory (see above)
  int64_t rows = 0, depth = 0;      // the operand's M (or N) and K
  int tm = 0;                       // rows of the tile
  int pitch = 0;                    // floats from one k's row to the next in shared memory
  bool tf32 = false;                // values rounded to tf32 for mma.sync
  DType dtype = DType::f32;         // of the operand in global memory: f32, or bf16 (widened on load)
  std::vector<Reg> tile_r, tile_k;  // per load slot (along rows: slot 0's): row and k within the tile (index type)
  int async_chunks = 0;             // async: the thread's chunks a tile
  std::vector<Reg> row_ok;          // per load slot (along rows: slot 0's): row0 + r < rows
  Reg chunk_bytes;                  // async: the bytes of the thread's chunks inside the rows (u32, 0-16)
  std::vector<Reg> smem_addr;       // per load slot (along rows: slot 0's): shared address of tile[k][r]
  int64_t k_step = 0;               // along rows: k from one slot to the next
  std::vector<Reg> values;          // per load slot: 1 value (along rows) or 4 (k groups), as loaded
  std::vector<Reg> oks;             // per value: inside the matrix
  int per_slot() const { return k_groups ? 4 : 1; }
};

// The loader of operand `view` (stored as `dtype` at `base`, `rows` x `depth` = K) for a tile of
// `tm` rows from row0 at shared address `smem` (`pitch` floats a k; tf32: values rounded).
TileLoader make_loader(KernelBuilder& b, Type it, Reg base, const MatmulOperand& view, DType dtype, int64_t rows,
                       int64_t depth, int tm, int pitch, bool tf32, Reg row0, Reg tid, Reg smem);

// A global load of `vec` elements of `type` (f32 or bf16) at addr + offset bytes into registers
// preset to 0, where `ok` holds.
std::vector<Reg> guarded_load(KernelBuilder& b, Type type, Reg addr, int vec, Reg ok, int64_t offset = 0);

// Loads the tile at k0 from global memory into t.values; an async loader copies it straight into
// its shared tile, `offset` bytes past the loader's (the buffer store_tile would be given).
void fetch_tile(KernelBuilder& b, Type it, const TileLoader& t, Reg k0, int64_t offset = 0);

// Stores the fetched tile into shared memory (k groups: k j of a slot is a pitch further),
// `offset` bytes past the loader's tile (the second of two tile buffers). Nothing for an async
// loader, whose fetch wrote it.
void store_tile(KernelBuilder& b, const TileLoader& t, int64_t offset = 0);

// ---- The tensor-core matmul kernel's pieces (its choices: matmul_tiling.cpp; its main loop:
// matmul_mma_loop.cpp), which the matmul lowering (matmul.cpp) puts between its prologue and
// its epilogue (matmul_epilogue.cpp).

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
// tile=waves: see wave_tile (matmul_tiling.cpp). tile=192x256 (wgmma; else
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

// ---- The plan (matmul_tiling.cpp): every choice of the kernel, made before it is built.

// What lower_matmul_program decides before it emits anything: the program with its batch dims
// folded (fold_batch_into_rows), which kernel (cp.async mma or FFMA) on which tiles, split-K, and
// the index type. Filled by plan_matmul; the kernel's phases read it.
struct MatmulPlan {
  std::vector<std::vector<int64_t>> extra_strides;  // per extra, against the logical domain
  FusedMatmul f;
  int64_t M = 0, N = 0, K = 0;
  int nb = 0;
  int64_t batch = 0;
  bool bf16_values = false;  // both operands carry bf16 values
  MmaInput mma_input = MmaInput::bf16;
  std::optional<std::array<MmaStage, 2>> mma_stages;
  bool cp_async_mma = false;  // the cp.async mma kernel, either input
  MmaTiling mma;
  int threads = 0;
  MatmulTiling tile{};
  int64_t grid_m = 0, grid_n = 0;
  int64_t splits = 1, k_split = 0;
  Type it = Type::u32;
  bool tensor_copies = false;
};

// The plan of the kernel for op as `program` describes: no instruction emitted; fails where the
// grid cannot hold the batch or the row tiles.
MatmulPlan plan_matmul(const Circuit& c, const Op& op, const FusedMatmul& program, const Target& target);

// ---- The main loop of the tensor-core kernel (matmul_mma_loop.cpp).

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

// ---- The matmul kernel (matmul.cpp), shared by matmul and fused_matmul.

// Lowers op (of c) as the program `f` describes (batch dims that the rows continue through folded
// into the rows); kernels are named `prefix` and a hash.
LoweredOp lower_matmul_program(const Circuit& c, const Op& op, const FusedMatmul& f, const char* prefix,
                               const Target& target);

// ---- The matmul kernel's epilogue (matmul_epilogue.cpp): from the accumulators that
// lower_matmul_program (matmul.cpp) leaves after its main loop, each epilogue body of (c,
// extras) stored through the output layout, block sums, and split-K's partials added by each
// tile's last block.

// What the epilogue reads of the kernel built before it (registers of `b`; `it` the index type).
struct MatmulEpilogueInputs {
  KernelBuilder& b;
  Type it;
  const FusedMatmul& f;                                    // batch dims folded into the rows as the kernel was built
  const std::vector<int>& read_extras;                     // the extras some body reads
  const std::vector<std::vector<int64_t>>& extra_strides;  // per extra, against the logical domain
  const std::vector<Reg>& extra_base;                      // per extra read: its batch item's address
  Reg out_off;                                             // the batch item's element offset in c
  const std::vector<Reg>& p_out;                           // per epilogue body: its output's address
  Reg p_block_sums, p_partials, p_counters;                // where the op has them
  MatmulTiling tile;
  // The cp.async mma kernel's tiling and stage layouts (a default MmaTiling and nothing for the
  // FFMA kernels); read where mma.wgmma: the staged stores go into the free stages.
  const MmaTiling& mma;
  const std::optional<std::array<MmaStage, 2>>& mma_stages;
  int threads;
  int64_t splits, grid_m, grid_n;
  Reg z, grid_z;       // the batch item; grid z (z x splits + the split)
  Reg m0, n0, tid;     // the tile's first row and column, the thread
  Reg as;              // the shared tiles' base (wgmma: both operands' stages), free now
  Reg tx, ty;          // FFMA tiles: the thread's place in 16 x 16
  Reg warp_m, warp_n;  // tensor-core tiles: the warp's first row and column in the tile,
  Reg g, q;            // and the lane's group (lane / 4) and place in it (lane % 4)
  int m_tiles;         // 16-row products a warp (mma.sync 4, wgmma 1)
  const std::vector<Reg>& acc;
};

// How the epilogue stored its interior tiles, for the kernel's summary.
struct MatmulEpilogueEmitted {
  bool staged_emitted = false;  // through shared memory (StagedStores)
  bool staged_chunks = false;   // 16 bytes a store (else a row a warp)
};

MatmulEpilogueEmitted emit_matmul_epilogue(const MatmulEpilogueInputs& in);

// ---- The wgmma matmul kernel's stores through shared memory (matmul_epilogue.cpp), for
// outputs whose rows start at odd elements (an odd row stride: GPT-2's logits, rows of 50257
// floats). The accumulators hold column pairs; where a pair cannot go out as one store, each
// element went out alone, and a warp's store instruction then wrote 8 rows a few elements each: on
// an H100 the LM head's forward product (8192 x 50257 x 768, f32 out) took 3.8 ms against 2.0-2.2
// ms for the same product at 50264 or 50304 columns. Staged, each output's tile is written into
// shared memory in the accumulators' layout (the stages are free once the main loop is over), then
// copied out a row a warp: lane l takes columns l, l + 32, ..., so that every store instruction
// writes 32 consecutive elements of one row. The values are the same bits: rounded to the output's
// type as they are staged, then moved.

class StagedStores {
 public:
  // Tiles of tm x tn (tn a multiple of 32) for outputs of `bytes` (2: bf16, 4: f32) each, within
  // `shared_bytes`; copied out by `threads` threads into rows `out_row` elements apart, an
  // element an access, or with `chunks` 16 bytes (the caller sees to their alignment). Nothing
  // where the tiles do not fit, where the warps do not divide the tile's rows, or where an offset
  // within the tile's rows of output would not fit PTX's 32-bit immediates.
  static std::optional<StagedStores> plan(int tm, int tn, int threads, const std::vector<uint32_t>& bytes, bool chunks,
                                          int64_t shared_bytes, int64_t out_row);

  // After the main loop: a barrier (every warp's products are done with the stages), then the
  // thread's base address in each output's tile: tile row `row`, column `col`, its first pair.
  void begin(KernelBuilder& b, Reg smem, Reg row, Reg col);
  // Output r's column pair (values[0], values[1]), dr rows and dc columns (even) from the
  // thread's first: one shared store, 8 bytes for f32, 4 for a bf16 pair.
  void put(KernelBuilder& b, size_t r, int64_t dr, int64_t dc, const std::array<Reg, 2>& values) const;
  // A barrier, then every output's tile to global memory: tile[r] is output r's address of the
  // tile's element (0, 0), `it` the kernel's index type.
  void copy_out(KernelBuilder& b, Type it, Reg tid, const std::vector<Reg>& tile) const;

 private:
  struct Output {
    uint32_t bytes;   // an element's
    uint32_t access;  // a copy-out access's: an element's, or 16
    uint32_t pitch;   // from one shared row to the next
    uint32_t offset;  // the tile's start in the shared array
    int lanes;        // a warp's lanes on one row in the copy-out
  };
  StagedStores() = default;
  int tm_ = 0, tn_ = 0, warps_ = 0;
  int64_t out_row_ = 0;
  std::vector<Output> outputs_;
  Reg smem_;
  std::vector<Reg> base_;  // per output: the thread's first pair in shared memory
};

}  // namespace kiln::cuda
