// The matmul kernel's epilogue (matmul_epilogue.cpp): from the accumulators that
// lower_matmul_program (fused_matmul.cpp) leaves after its main loop, each epilogue body of (c,
// extras) stored through the output layout, block sums, and split-K's partials added by each
// tile's last block. Internal to cuda/lower/.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/cuda/lower/matmul_mma.hpp>
#include <kiln/cuda/lower/matmul_tiles.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

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
  bool staged_emitted = false;  // through shared memory (matmul_staged_stores.hpp)
  bool staged_chunks = false;   // 16 bytes a store (else a row a warp)
};

MatmulEpilogueEmitted emit_matmul_epilogue(const MatmulEpilogueInputs& in);

}  // namespace kiln::cuda
