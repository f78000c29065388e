// The wgmma matmul kernel's stores through shared memory (its epilogue: matmul_epilogue.cpp), for
// outputs whose rows start at odd elements (an odd row stride: GPT-2's logits, rows of 50257
// floats). The accumulators hold column pairs; where a pair cannot go out as one store, each
// element went out alone, and a warp's store instruction then wrote 8 rows a few elements each: on
// an H100 the LM head's forward product (8192 x 50257 x 768, f32 out) took 3.8 ms against 2.0-2.2
// ms for the same product at 50264 or 50304 columns. Staged, each output's tile is written into
// shared memory in the accumulators' layout (the stages are free once the main loop is over), then
// copied out a row a warp: lane l takes columns l, l + 32, ..., so that every store instruction
// writes 32 consecutive elements of one row. The values are the same bits: rounded to the output's
// type as they are staged, then moved. Internal to cuda/lower/.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

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
