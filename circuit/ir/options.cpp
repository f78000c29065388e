// Parsing of the KILN_* environment variables.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <sstream>
#include <utility>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/options.hpp>

extern char** environ;

namespace kiln::options {

namespace {

// nullptr when unset.
const char* raw(const char* name) { return std::getenv(name); }

bool set_and_not_zero(const char* name) {
  const char* v = raw(name);
  return v && std::string(v) != "0";
}

std::string text(const char* name) {
  const char* v = raw(name);
  return v ? v : "";
}

constexpr std::array<Variable, 36> kVariables = {{
    {"KILN_NUM_THREADS", "fixed CPU thread count (1-4096); unset: adaptive"},
    {"KILN_DISABLE_PASSES", "comma-separated passes to switch off (kiln prims lists them)"},
    {"KILN_PROFILE", "time each Prim's reference on the CPU; print the N costliest at exit"},
    {"KILN_POISON_BUFFERS", "fill executor buffers with NaN / -1 before each op (tests)"},
    {"KILN_CUDA_GRAPHS", "0: launch kernels one by one instead of replaying CUDA graphs"},
    {"KILN_FAKE_CUDA", "1: the CUDA device is the SIMT simulator (no GPU needed)"},
    {"KILN_DUMP", "print each plan's recorded and optimized Circuit"},
    {"KILN_CACHE_DIR", "compiled-module disk cache; off: none (default ~/.cache/kiln)"},
    {"KILN_PTX_DUMP", "directory to write every generated kernel's PTX to"},
    {"KILN_MATMUL_TILE", "GPU matmul tiles, 64 or 128 (default: chosen per shape)"},
    {"KILN_ALLOW_TF32", "1: GPU f32 matmuls on tf32 tensor cores (10-bit mantissas)"},
    {"KILN_BF16_MMA", "0: GPU matmuls of bf16 operands on widened tiles instead of bf16 mma.sync (default 1)"},
    {"KILN_MMA_STAGES",
     "cp.async stages of the mma.sync matmul kernel (bf16, tf32), 2-4 (default 2; wgmma: 3-4, default 4)"},
    {"KILN_WGMMA",
     "1: bf16 matmuls on sm_90a's wgmma (H100/H200 only), 0: on mma.sync (default: wgmma on an sm_90 GPU, mma.sync "
     "elsewhere and on the fake driver)"},
    {"KILN_MMA_TILE",
     "block tile of the tensor-core matmul kernel (mma.sync bf16 and tf32, wgmma), 128x128 (default on mma.sync), "
     "128x256, 192x256 (wgmma: three warpgroups, no split of K; products with block sums and mma.sync: 128x256), auto "
     "(128x256 where its grid fills the SMs; default on wgmma), or waves (wgmma: the tile whose grid takes fewer "
     "whole waves of the SMs, a 128x256 wave counted 1.6 of a 128x128 one and a 192x256 one 2.4; mma.sync: auto)"},
    {"KILN_MMA_SPLIT_K",
     "tensor-core matmuls (bf16, tf32) split K across blocks: 0, auto, or 2-4 (default: auto on wgmma, 0 on mma.sync)"},
    {"KILN_MMA_STAGED_STORES",
     "wgmma matmuls store interior tiles through shared memory: odd (outputs whose rows start at odd elements, the "
     "default), all (also rows of whole 16-byte chunks, 16 bytes a store), or 0 (never)"},
    {"KILN_WGMMA_PRODUCTS_FIRST",
     "1: wgmma matmuls issue a k step's products before its copies of a later step (default 0: copies first)"},
    {"KILN_WGMMA_TENSOR_COPIES",
     "1: wgmma matmuls without a batch fill their stages by tensor copies (cp.async.bulk.tensor) instead of cp.async "
     "(default 0)"},
    {"KILN_ATTENTION_MMA", "0: GPU attention of bf16 operands on FFMA kernels instead of bf16 mma.sync (default 1)"},
    {"KILN_COLLECTIVE_TIMEOUT", "data parallel: seconds a collective waits for the other ranks (default 300)"},
    {"KILN_GPU_COLLECTIVES", "data parallel on GPUs: nccl or host (default: NCCL where it loads)"},
    {"KILN_NCCL_LIBRARY", "path of libnccl.so.2 (default: the loader's search path)"},
    {"KILN_CUDA_DEVICE", "GPU ordinal to use (default: the local rank under mpirun/srun, else 0)"},
    {"KILN_REQUIRE_GPU", "tests: fail instead of skipping when no GPU is usable"},
    {"KILN_REQUIRE_PTXAS", "tests: fail instead of skipping when ptxas is missing"},
    {"KILN_REQUIRE_REFERENCE", "tests: fail instead of skipping without the PyTorch reference"},
    {"KILN_REQUIRE_TMPFS", "tests: DiskFullSweep fails instead of skipping where it cannot mount a tmpfs"},
    {"KILN_REQUIRE_CURAND", "tests: fail instead of skipping without the CUDA toolkit's libcurand"},
    {"KILN_BENCH_VENV", "scripts: the PyTorch virtual environment for benchmarks"},
    {"KILN_BENCH_TURNS", "scripts: turns of kiln and PyTorch each in bench_cpu_vs_torch.sh (default 4)"},
    {"KILN_EXTRA_PACKAGES", "scripts: extra Debian packages for setup.sh"},
    {"KILN_FUZZ_VERBOSE", "scripts: libFuzzer's full output"},
    {"KILN_BUNDLE", "scripts: the build bundle gpu-check runs"},
    {"KILN_CHECK_*", "scripts: gpu-check's corpus, reference and stage time limits"},
    {"KILN_AB_*", "scripts: gpu_env_ab.sh's tests, GEMM shapes and f32 step"},
}};

// A name ending in '*' stands for every name with that prefix.
bool matches(const Variable& v, const std::string& name) {
  const std::string pattern = v.name;
  if (pattern.back() == '*') return name.rfind(pattern.substr(0, pattern.size() - 1), 0) == 0;
  return name == pattern;
}

}  // namespace

int num_threads() {
  const char* v = raw("KILN_NUM_THREADS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  if (*end != '\0' || parsed < 1 || parsed > 4096)
    throw Error(std::string("KILN_NUM_THREADS: expected a thread count from 1 to 4096, received '") + v + "'");
  return static_cast<int>(parsed);
}

int matmul_tile() {
  const std::string v = text("KILN_MATMUL_TILE");
  if (v.empty()) return 0;
  if (v != "64" && v != "128")
    throw Error("KILN_MATMUL_TILE: expected 64 or 128 (a matmul tile's rows and columns), received '" + v + "'");
  return std::stoi(v);
}

bool allow_tf32() { return text("KILN_ALLOW_TF32") == "1"; }

double collective_timeout() {
  const char* v = raw("KILN_COLLECTIVE_TIMEOUT");
  if (!v || !*v) return 300.0;
  char* end = nullptr;
  const double parsed = std::strtod(v, &end);
  if (*end != '\0' || !(parsed > 0 && parsed <= 86400))
    throw Error(std::string("KILN_COLLECTIVE_TIMEOUT: expected seconds from 0 to 86400, received '") + v + "'");
  return parsed;
}
std::string gpu_collectives() {
  const std::string v = text("KILN_GPU_COLLECTIVES");
  if (!v.empty() && v != "nccl" && v != "host")
    throw Error("KILN_GPU_COLLECTIVES: expected nccl or host, received '" + v + "'");
  return v;
}

int cuda_device() {
  const char* v = raw("KILN_CUDA_DEVICE");
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > 1023)
    throw Error(std::string("KILN_CUDA_DEVICE: expected a GPU ordinal (0, 1, ...), received '") + v + "'");
  return static_cast<int>(parsed);
}

namespace {
std::optional<bool> bf16_mma_forced;
}
bool bf16_mma() {
  if (bf16_mma_forced) return *bf16_mma_forced;
  const std::string v = text("KILN_BF16_MMA");
  if (v.empty() || v == "1") return true;
  if (v == "0") return false;
  throw Error("KILN_BF16_MMA: expected 0 or 1, received '" + v + "'");
}
std::optional<bool> force_bf16_mma(std::optional<bool> on) { return std::exchange(bf16_mma_forced, on); }

int mma_stages() {
  const std::string v = text("KILN_MMA_STAGES");
  if (v.empty()) return 0;
  if (v != "2" && v != "3" && v != "4")
    throw Error("KILN_MMA_STAGES: expected 2, 3 or 4 (the bf16 matmul kernel's cp.async stages), received '" + v + "'");
  return std::stoi(v);
}

int mma_tile_n() {
  const std::string v = text("KILN_MMA_TILE");
  if (v.empty()) return 0;
  if (v == "auto") return -1;
  if (v == "waves") return -2;
  if (v != "128x128" && v != "128x256" && v != "192x256")
    throw Error(
        "KILN_MMA_TILE: expected 128x128, 128x256, 192x256, auto or waves (the bf16 matmul kernel's block tile), "
        "received '" +
        v + "'");
  return v == "128x128" ? 128 : 256;
}

int mma_tile_m() { return text("KILN_MMA_TILE") == "192x256" ? 192 : 128; }

std::optional<int> mma_split_k() {
  const std::string v = text("KILN_MMA_SPLIT_K");
  if (v.empty()) return std::nullopt;
  if (v == "0") return 0;
  if (v == "auto") return -1;
  if (v != "2" && v != "3" && v != "4")
    throw Error("KILN_MMA_SPLIT_K: expected 0, auto, 2, 3 or 4 (blocks sharing a matmul tile's K), received '" + v +
                "'");
  return std::stoi(v);
}

std::optional<bool> wgmma() {
  const std::string v = text("KILN_WGMMA");
  if (v.empty()) return std::nullopt;
  if (v == "0") return false;
  if (v == "1") return true;
  throw Error("KILN_WGMMA: expected 0 or 1 (bf16 matmuls on sm_90a's wgmma), received '" + v + "'");
}

MmaStaging mma_staging() {
  const std::string v = text("KILN_MMA_STAGED_STORES");
  if (v.empty() || v == "odd") return MmaStaging::odd_rows;
  if (v == "all") return MmaStaging::all;
  if (v == "0") return MmaStaging::none;
  throw Error(
      "KILN_MMA_STAGED_STORES: expected odd, all or 0 (wgmma matmul tiles stored through shared memory), "
      "received '" +
      v + "'");
}

bool wgmma_products_first() {
  const std::string v = text("KILN_WGMMA_PRODUCTS_FIRST");
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw Error("KILN_WGMMA_PRODUCTS_FIRST: expected 0 or 1, received '" + v + "'");
}

bool wgmma_tensor_copies() {
  const std::string v = text("KILN_WGMMA_TENSOR_COPIES");
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  throw Error("KILN_WGMMA_TENSOR_COPIES: expected 0 or 1, received '" + v + "'");
}

bool attention_mma() {
  const std::string v = text("KILN_ATTENTION_MMA");
  if (v.empty() || v == "1") return true;
  if (v == "0") return false;
  throw Error("KILN_ATTENTION_MMA: expected 0 or 1, received '" + v + "'");
}

std::vector<std::string> disabled_passes() {
  std::vector<std::string> names;
  std::stringstream ss(text("KILN_DISABLE_PASSES"));
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) names.push_back(item);
  return names;
}

int profile_top() {
  const char* v = raw("KILN_PROFILE");
  if (!v) return 0;
  const int n = std::atoi(v);
  return n > 1 ? n : 25;
}

bool poison_buffers() { return set_and_not_zero("KILN_POISON_BUFFERS"); }
bool cuda_graphs() { return text("KILN_CUDA_GRAPHS") != "0"; }
bool fake_cuda() { return text("KILN_FAKE_CUDA") == "1"; }
bool dump_circuits() { return set_and_not_zero("KILN_DUMP"); }
std::string cache_dir() { return text("KILN_CACHE_DIR"); }
std::string ptx_dump_dir() { return text("KILN_PTX_DUMP"); }

std::span<const Variable> variables() { return kVariables; }

std::vector<std::string> unknown_variables() {
  std::vector<std::string> unknown;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    if (entry.rfind("KILN_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    if (std::none_of(kVariables.begin(), kVariables.end(), [&](const Variable& v) { return matches(v, name); }))
      unknown.push_back(name);
  }
  return unknown;
}

}  // namespace kiln::options
