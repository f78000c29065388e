// The matmul kernel's tiling (MatmulTiling), and the FFMA-tile kernel's operand tiles
// (fused_matmul.cpp): a tile of an operand fetched through its view into registers, then stored
// to shared memory with its prologue applied; or, for an f32 operand stored along its rows,
// copied into shared memory by cp.async.
// Internal to cuda/lower/.
#pragma once

#include <cstdint>
#include <vector>

#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

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

}  // namespace kiln::cuda
