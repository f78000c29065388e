// Every KILN_* environment variable the library reads, parsed and checked here and nowhere
// else. An accessor reads the environment when it is called; its callers call it when they set
// up (a Program, a plan, the CUDA runtime), so a variable set around one part of a program (a
// test's scope) applies to what that part builds. A malformed value is an error naming the
// variable and what it expects.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kiln::options {

int num_threads();                           // KILN_NUM_THREADS: 1..4096; 0 when unset (adaptive)
std::vector<std::string> disabled_passes();  // KILN_DISABLE_PASSES: comma-separated pass names
int profile_top();                           // KILN_PROFILE: 0 when unset, else ops listed (25 unless N > 1)
bool poison_buffers();                       // KILN_POISON_BUFFERS: set and not "0"
bool cuda_graphs();                          // KILN_CUDA_GRAPHS: on unless "0"
bool fake_cuda();                            // KILN_FAKE_CUDA: "1" runs CUDA on the simulator
bool dump_circuits();                        // KILN_DUMP: set and not "0"
std::string cache_dir();                     // KILN_CACHE_DIR: "" when unset; "off" disables the cache
std::string ptx_dump_dir();                  // KILN_PTX_DUMP: "" when unset
int matmul_tile();                           // KILN_MATMUL_TILE: 64 or 128; 0 when unset (per shape)
bool allow_tf32();                           // KILN_ALLOW_TF32: "1" (default off, as PyTorch)
double collective_timeout();                 // KILN_COLLECTIVE_TIMEOUT: seconds in (0, 86400]; 300 when unset
std::string gpu_collectives();               // KILN_GPU_COLLECTIVES: "nccl", "host", or "" (automatic)
int cuda_device();                           // KILN_CUDA_DEVICE: a GPU ordinal; -1 when unset
bool bf16_mma();                             // KILN_BF16_MMA: "1" (the default) or "0", unless forced
// Tests (cuda::ForceBf16Mma): bf16_mma() returns `on` while it is set, whatever the environment
// says (nullopt: the environment again); the previous setting is returned.
std::optional<bool> force_bf16_mma(std::optional<bool> on);
bool attention_mma();  // KILN_ATTENTION_MMA: "1" (the default) or "0"
int mma_stages();      // KILN_MMA_STAGES: the mma kernel's cp.async stages, 2-4; 0 when unset (2)
// KILN_MMA_TILE: the mma kernel's block tile, 128x128, 128x256 or 192x256: its columns; 0 when
// unset, -1 for auto, -2 for waves (chosen per product: cuda/lower/matmul_mma.hpp).
int mma_tile_n();
int mma_tile_m();  // its rows: 192 for 192x256, else 128

// KILN_MMA_SPLIT_K: the mma kernel's split of K across blocks: 0 for "0" (none), -1 for "auto"
// (per shape, where the grid leaves SMs idle), or 2-4 (that many wherever K allows); nothing
// when unset (the kernel's engine decides: cuda/lower/matmul_mma.hpp).
std::optional<int> mma_split_k();
// KILN_WGMMA: "1" puts the bf16 mma kernel's products on sm_90a's wgmma (its kernels then load on
// sm_90 devices only), "0" on mma.sync; nothing when unset (the lowering's target decides:
// cuda::WgmmaByDefault).
std::optional<bool> wgmma();
// KILN_MMA_STAGED_STORES: which wgmma matmul outputs go out through shared memory
// (cuda/lower/matmul_staged_stores.hpp): those whose rows start at odd elements (the default);
// with "all" those too whose rows and batch items are whole 16-byte chunks; with "0" none.
enum class MmaStaging { none, odd_rows, all };
MmaStaging mma_staging();
// KILN_WGMMA_PRODUCTS_FIRST: "1" issues each k step's wgmma products before its cp.async copies
// of a later step (cuda/lower/matmul_mma_loop.cpp); "0" or unset: copies first.
bool wgmma_products_first();
// KILN_WGMMA_TENSOR_COPIES: "1" fills the wgmma matmul's stages with the tensor copy engine
// (cp.async.bulk.tensor on an mbarrier a stage; cuda/lower/matmul_mma_loop.cpp) where the product has
// no batch; "0" or unset: cp.async copies by every thread.
bool wgmma_tensor_copies();

struct Variable {
  const char* name;
  const char* meaning;
};
// The variables above, and those kiln's tests and scripts read (so that they are not unknown).
std::span<const Variable> variables();
// KILN_* names in the environment that no part of kiln reads: most likely typos, which would
// otherwise change nothing without a word.
std::vector<std::string> unknown_variables();

}  // namespace kiln::options
