// Parsing of kiln's environment variables: the one place kiln calls getenv.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>

extern char** environ;

namespace kiln {

namespace {

// nullptr when unset.
const char* raw(const char* name) { return std::getenv(name); }

std::string text(const char* name) {
  const char* v = raw(name);
  return v ? v : "";
}

bool set_and_not_zero(const char* name) {
  const char* v = raw(name);
  return v && std::string(v) != "0";
}

// A whole decimal number in [lo, hi], or `unset` when the variable is unset or empty.
long whole_number(const char* name, long lo, long hi, long unset, const char* expected) {
  const char* v = raw(name);
  if (!v || !*v) return unset;
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 10);
  if (*end != '\0' || parsed < lo || parsed > hi)
    throw Error(std::string(name) + ": expected " + expected + ", received '" + v + "'");
  return parsed;
}

constexpr std::array<Variable, 29> kVariables = {{
    {"KILN_NUM_THREADS", "fixed CPU thread count (1-4096); unset: adaptive"},
    {"KILN_PROFILE", "time each Prim's reference on the CPU; print the N costliest at exit"},
    {"KILN_DUMP", "print each plan's recorded and optimized Circuit"},
    {"KILN_CACHE_DIR", "compiled-module disk cache; off: none (default ~/.cache/kiln)"},
    {"KILN_PTX_DUMP", "directory to write every generated kernel's PTX to"},
    {"KILN_COLLECTIVE_TIMEOUT", "data parallel: seconds a collective waits for the other ranks (default 300)"},
    {"KILN_NCCL_LIBRARY", "path of libnccl.so.2 (default: the loader's search path)"},
    {"KILN_CUDA_DEVICE", "GPU ordinal to use (default: the local rank under mpirun/srun, else 0)"},
    {"KILN_REQUIRE_GPU", "tests: fail instead of skipping when no GPU is usable"},
    {"KILN_REQUIRE_PTXAS", "tests: fail instead of skipping when ptxas is missing"},
    {"KILN_REQUIRE_REFERENCE", "tests: fail instead of skipping without the PyTorch reference"},
    {"KILN_REQUIRE_TMPFS", "tests: DiskFullSweep fails instead of skipping where it cannot mount a tmpfs"},
    {"KILN_REQUIRE_CURAND", "tests: fail instead of skipping without the CUDA toolkit's libcurand"},
    {"KILN_REQUIRE_TRANSFORMERS", "tests: KilnMatchesTransformers fails instead of skipping without transformers"},
    {"KILN_REFERENCE_DIR", "tests: the PyTorch float64 reference's directory (default: ../shared/reference)"},
    {"KILN_PYTHON", "tests: the Python that has transformers, tokenizers and h5py"},
    {"KILN_BENCH_VENV", "scripts: the PyTorch virtual environment for benchmarks"},
    {"KILN_BENCH_TURNS", "scripts: turns of kiln and PyTorch each in bench_cpu_vs_torch.sh (default 4)"},
    {"KILN_EXTRA_PACKAGES", "scripts: extra Debian packages for setup.sh"},
    {"KILN_FUZZ_VERBOSE", "scripts: libFuzzer's full output"},
    {"KILN_BUNDLE", "scripts: the build bundle gpu-check runs"},
    {"KILN_CHECK_*", "scripts: gpu-check's corpus, reference and stage time limits"},
    {"KILN_GEMM_*", "scripts: the GEMM libraries, shapes and tilings the benchmark scripts time"},
    {"KILN_ATTENTION_SHAPES", "scripts: bench_gpu_matmul.sh's attention shapes"},
    {"KILN_STALL_CASES", "scripts: gpu_gemm_stalls.sh's products"},
    {"KILN_STEP_TILINGS", "scripts: gpu_mma_tilings.sh's step tilings"},
    {"KILN_TF32_TILINGS", "scripts: gpu_mma_tilings.sh's tf32 tilings"},
    {"KILN_TILINGS_TESTS", "scripts: gpu_mma_tilings.sh's gtest filter"},
    {"KILN_AB_*", "scripts: gpu_env_ab.sh's tests, GEMM shapes and f32 step"},
}};

// Variables kiln read once, and the options that replaced them (issue 47: choices that steer
// lowering are the Target's, passed explicitly, never ambient).
struct Removed {
  const char* name;
  const char* instead;
};
constexpr std::array<Removed, 16> kRemoved = {{
    {"KILN_MATMUL_TILE", "--matmul simt-tile=64|128 (MatmulPolicy::simt_tile)"},
    {"KILN_BF16_MMA", "--matmul bf16-mma=on|off (MatmulPolicy::bf16_mma)"},
    {"KILN_MMA_STAGES", "--matmul stages=2|3|4 (MatmulPolicy::stages)"},
    {"KILN_MMA_TILE", "--matmul tile=128x128|128x256|192x256|auto|waves (MatmulPolicy::tile_m, tile_n)"},
    {"KILN_MMA_SPLIT_K", "--matmul split-k=0|auto|2|3|4 (MatmulPolicy::split_k)"},
    {"KILN_WGMMA", "--matmul wgmma=on|off (MatmulPolicy::wgmma)"},
    {"KILN_MMA_STAGED_STORES", "--matmul staged-stores=none|odd|all (MatmulPolicy::staged_stores)"},
    {"KILN_WGMMA_PRODUCTS_FIRST", "--matmul products-first=on (MatmulPolicy::products_first)"},
    {"KILN_WGMMA_TENSOR_COPIES", "--matmul tensor-copies=on (MatmulPolicy::tensor_copies)"},
    {"KILN_ATTENTION_MMA", "--attention-path mma|simt (Target::attention)"},
    {"KILN_ALLOW_TF32", "--tf32 (Target::tf32)"},
    {"KILN_DISABLE_PASSES", "--passes -NAME,... (PipelineOptions::disabled)"},
    {"KILN_CUDA_GRAPHS", "--no-cuda-graphs (Target::cuda_graphs)"},
    {"KILN_GPU_COLLECTIVES", "--collectives nccl|host"},
    {"KILN_FAKE_CUDA", "--device sim"},
    {"KILN_POISON_BUFFERS", "--poison-buffers (kiln::set_poison_buffers)"},
}};

// A name ending in '*' stands for every name with that prefix.
bool matches(const char* pattern_text, const std::string& name) {
  const std::string pattern = pattern_text;
  if (pattern.back() == '*') return name.rfind(pattern.substr(0, pattern.size() - 1), 0) == 0;
  return name == pattern;
}

std::vector<std::string> kiln_names_in_environment() {
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    if (entry.rfind("KILN_", 0) == 0) names.push_back(entry.substr(0, entry.find('=')));
  }
  return names;
}

}  // namespace

Settings settings() {
  Settings s;
  s.num_threads = static_cast<int>(whole_number("KILN_NUM_THREADS", 1, 4096, 0, "a thread count from 1 to 4096"));
  if (const char* v = raw("KILN_PROFILE")) s.profile_top = std::atoi(v) > 1 ? std::atoi(v) : 25;
  s.dump_circuits = set_and_not_zero("KILN_DUMP");
  s.cache_dir = text("KILN_CACHE_DIR");
  if (s.cache_dir.empty()) {
    if (const std::string xdg = text("XDG_CACHE_HOME"); !xdg.empty())
      s.cache_dir = xdg + "/kiln";
    else if (const std::string home = text("HOME"); !home.empty())
      s.cache_dir = home + "/.cache/kiln";
  }
  s.ptx_dump_dir = text("KILN_PTX_DUMP");
  s.cuda_device = static_cast<int>(whole_number("KILN_CUDA_DEVICE", 0, 1023, -1, "a GPU ordinal (0, 1, ...)"));
  s.nccl_library = text("KILN_NCCL_LIBRARY");
  if (s.nccl_library.empty()) s.nccl_library = "libnccl.so.2";
  if (const char* v = raw("KILN_COLLECTIVE_TIMEOUT"); v && *v) {
    char* end = nullptr;
    s.collective_timeout = std::strtod(v, &end);
    if (*end != '\0' || !(s.collective_timeout > 0 && s.collective_timeout <= 86400))
      throw Error(std::string("KILN_COLLECTIVE_TIMEOUT: expected seconds from 0 to 86400, received '") + v + "'");
  }
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    const char* v = raw(name);
    char* end = nullptr;
    const long rank = v && *v ? std::strtol(v, &end, 10) : -1;
    if (rank >= 0 && *end == '\0') {
      s.launcher_local_rank = static_cast<int>(rank);
      break;
    }
  }
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = raw(name); v && std::atoi(v) > 1) s.launcher_several_ranks = true;
  s.search_path = text("PATH");
  s.malloc_mmap_threshold_set = raw("MALLOC_MMAP_THRESHOLD_") != nullptr;
  s.malloc_trim_threshold_set = raw("MALLOC_TRIM_THRESHOLD_") != nullptr;
  return s;
}

std::span<const Variable> variables() { return kVariables; }

std::vector<std::string> unknown_variables() {
  std::vector<std::string> unknown;
  for (const std::string& name : kiln_names_in_environment())
    if (std::none_of(kVariables.begin(), kVariables.end(), [&](const Variable& v) { return matches(v.name, name); }) &&
        std::none_of(kRemoved.begin(), kRemoved.end(), [&](const Removed& r) { return name == r.name; }))
      unknown.push_back(name);
  return unknown;
}

std::vector<std::string> removed_variable_warnings() {
  std::vector<std::string> warnings;
  for (const std::string& name : kiln_names_in_environment())
    for (const Removed& r : kRemoved)
      if (name == r.name) warnings.push_back(name + " is no longer read: use " + r.instead);
  return warnings;
}

}  // namespace kiln
