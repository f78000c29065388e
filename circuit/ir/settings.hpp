// kiln's operational settings: the environment variables the library reads, parsed and checked
// here and nowhere else (this is the one file that calls getenv). They say where and how much
// (threads, the cache directory, the device index, the NCCL library, the collective timeout,
// dumps, the profile), never how a plan is lowered: those choices are the Target's
// (circuit/ir/target.hpp) and the pipeline's options (circuit/passes/pipeline.hpp), typed and
// passed explicitly.
//
// settings() reads the environment when it is called; its callers call it when they set up (a
// Program, the CUDA runtime), so a variable set around one part of a program (a test's scope)
// applies to what that part builds. A malformed value of any of them is an error naming the
// variable and what it expects, wherever settings() is called (the CLI reads them first of all,
// so that the error comes before any work).
#pragma once

#include <span>
#include <string>
#include <vector>

namespace kiln {

struct Settings {
  int num_threads = 0;              // KILN_NUM_THREADS: 1..4096; 0 when unset (adaptive)
  int profile_top = 0;              // KILN_PROFILE: 0 when unset, else ops listed (25 unless N > 1)
  bool dump_circuits = false;       // KILN_DUMP: set and not "0"
  std::string cache_dir;            // KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; "off": none
  std::string ptx_dump_dir;         // KILN_PTX_DUMP: "" when unset
  int cuda_device = -1;             // KILN_CUDA_DEVICE: a GPU ordinal; -1 when unset
  std::string nccl_library;         // KILN_NCCL_LIBRARY, else "libnccl.so.2"
  double collective_timeout = 300;  // KILN_COLLECTIVE_TIMEOUT: seconds in (0, 86400]
  // What launchers and the system say (not kiln's to set):
  int launcher_local_rank = -1;         // OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK
  bool launcher_several_ranks = false;  // OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_SIZE or MPI_LOCALNRANKS > 1
  std::string search_path;              // PATH (where ptxas is looked for)
  bool malloc_mmap_threshold_set = false, malloc_trim_threshold_set = false;  // glibc's MALLOC_*_
};

// The settings as the environment gives them now. Throws kiln::Error for a malformed value.
Settings settings();

struct Variable {
  const char* name;
  const char* meaning;
};
// The variables above, and those kiln's tests and scripts read (so that they are not unknown).
std::span<const Variable> variables();
// KILN_* names in the environment that no part of kiln reads: most likely typos, which would
// otherwise change nothing without a word. Removed variables are not listed (see below).
std::vector<std::string> unknown_variables();
// One warning per variable set in the environment that kiln no longer reads, naming the option
// that replaced it ("KILN_MMA_TILE is no longer read: use --matmul tile=..."). The library
// logs them (spdlog, warning) once when the first engine is made.
std::vector<std::string> removed_variable_warnings();

}  // namespace kiln
