// The autotuner: for each distinct kernel of a plan (kernel_signature: Prim, params, dtypes and
// shapes), the candidates the Target allows (KernelChoice: the f32 GEMM's library, the OpenMP
// threads an op runs on, causal attention's row blocks, fused-row chunks) are first each run
// alone on made-up inputs and checked against the default's output within the tolerance of a
// changed summation order (a candidate that fails is dropped and reported), then timed within the
// whole step: one Program of the plan per candidate index (the j-th candidate of every kernel at
// once), run in turns with the team size held fixed, each op timed where it runs. A kernel
// alone, its inputs hot in cache and the team awake, is a poor witness of its time in a step (on
// a 2-core AMD EPYC, oneDNN's matmul primitive was 10-30% faster alone and no faster in the step).
// The fastest candidate that beats the default by kMinGain (medians) is the kernel's choice; the
// choices are kept only if the whole step, timed in turns with and without them, gains kMinGain.
// Choices are cached per device identity in CACHE_DIR/tuning/DEVICE.json (TuningFile), keyed
// by kiln version and kernel signature; a file shipped in docs/tuning/ for the device serves
// where the user has none.
//
// On a CUDA Target the candidates are the matmul kernels' `--matmul` keys (gpu_candidates), each
// kernel run alone on the runtime, checked against Eigen's result and timed by the device (the
// first launch to the synchronize); the choices are kept per kernel (no whole-step check there
// yet). The attention path and the row kernels' blocks are not candidates yet.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/kernel_choice.hpp>
#include <kiln/circuit/ir/target.hpp>
#include <kiln/circuit/passes/pipeline.hpp>

namespace kiln::cuda {
class Runtime;
}

namespace kiln {

// `kiln train|bench --tune`: off (kiln's defaults), cached (the cached choices where present, the
// defaults elsewhere), on (tunes the kernels the cache lacks before the first step).
enum class TuneMode { off, cached, on };
TuneMode parse_tune_mode(std::string_view text);  // throws kiln::Error naming --tune
const char* tune_mode_name(TuneMode m);

// "cpu AMD EPYC 7B12 oneDNN avx2 fma": the CPU's model name, the GEMM library of this build and
// the instruction sets kiln's kernels use; for a CUDA Target, "gpu NVIDIA H100 80GB HBM3 sm_90
// driver 12080 wgmma" from its runtime `rt` (required there) and the Target's matmul path
// (wgmma or mma.sync, and tf32).
std::string device_identity(const Target& t, const cuda::Runtime* rt = nullptr);
// The identity as a file name: letters, digits, '.', '_' (runs of others become one '-'), then ".json".
std::string tuning_file_name(const std::string& identity);
// CACHE_DIR/tuning/FILE_NAME (tuning_file_name), or "" where the cache is off (KILN_CACHE_DIR=off).
std::string user_tuning_path(const std::string& identity);
// The file shipped with kiln for this device kind (in `shipped_dir`, by default docs/tuning/ of
// kiln's source tree), whether it exists or not.
std::string shipped_tuning_path(const std::string& identity, const std::string& shipped_dir = "");

struct TuningEntry {
  std::string kiln_version;  // the kiln that measured it: other versions' entries are kept, never applied
  std::string kernel;        // kernel_signature
  KernelChoice choice;
  double default_ms = 0, chosen_ms = 0;  // medians of the default and of the choice
  int candidates = 0;                    // how many were verified and timed
};

struct TuningFile {
  std::string device;  // device_identity
  std::vector<TuningEntry> entries;
  // This kiln version's choices, by kernel.
  KernelChoices choices() const;
  // Adds or replaces the entry for (kiln_version, kernel).
  void put(const TuningEntry& e);
};

// Reads and validates a whole tuning file. A missing file is an empty one for `device`; a file
// that is not valid JSON, breaks the format, or belongs to another device throws kiln::Error
// naming the file (never a silent fallback).
TuningFile read_tuning_file(const std::string& path, const std::string& device);
// Writes `file` atomically (a temporary beside it, then renamed over it), making its folder.
void write_tuning_file(const std::string& path, const TuningFile& file);

// Adds `entries` to the user's tuning file for `identity` (read and validated first: a corrupt or
// foreign one is an error, never overwritten) and writes it; returns its path ("" where the cache
// is off and nothing was written).
std::string record_tuning(const std::string& identity, const std::vector<TuningEntry>& entries);

// The choices a run uses under --tune cached: the user's file where it exists, else the shipped
// one (shipped_tuning_path); `from` gets the path read ("" where neither exists).
KernelChoices load_tuned_choices(const std::string& identity, std::string* from = nullptr,
                                 const std::string& shipped_dir = "");
// `choices` without what explicit options fix: with `threads_fixed` (--threads), no per-op
// thread counts (the user's team size wins over the tuner's); with `matmul_fixed` (--matmul), no
// per-kernel matmul keys.
KernelChoices without_overridden(const KernelChoices& choices, bool threads_fixed, bool matmul_fixed = false);

// A candidate's lead over the default below which the default stays (timing noise).
constexpr double kMinGain = 0.03;

struct TuneOptions {
  double budget_s = 120;  // timing rounds are fitted to it (3 at least)
  int team = 0;           // OpenMP threads held fixed while timing; 0: the run's (fixed count or all)
  // A CUDA Target's kernels run, are checked and timed on this runtime (the fake driver's
  // simulator checks them but never times them: it needs an injected clock).
  cuda::Runtime* runtime = nullptr;
  int gpu_rounds = 9;  // GPU: timed runs of each candidate, in turns
  // The time the tuner uses for a kernel's ops in one step under `choice`, given the measured one
  // (identity by default). Tests inject their own, deciding which candidate wins; with one, the
  // step's time is the sum of its ops' times so given.
  std::function<double(const std::string& kernel, const KernelChoice& choice, double measured_ms)> clock;
  std::function<void(const std::string& line)> progress;  // a line per stage and per timing round
};

struct CandidateResult {
  KernelChoice choice;
  double ms = 0;        // median per step (all the kernel's ops); 0 where it was not timed
  std::string failure;  // why it was dropped (a wrong result, an error); empty when verified
};
struct KernelResult {
  std::string kernel;
  int occurrences = 0;                      // ops of the plan with this signature
  std::vector<CandidateResult> candidates;  // the default first
  KernelChoice chosen;                      // the fastest verified candidate, or the default
  double default_ms = 0, chosen_ms = 0;     // per step
  std::string skipped;  // why it was not tuned (not runnable alone); empty otherwise
};
struct TuneReport {
  std::vector<KernelResult> kernels;  // costliest first
  int rounds = 0;                     // timing rounds of the whole step per candidate index
  double step_default_ms = 0, step_tuned_ms = 0;  // medians of the step in turns, without and with the choices
  bool kept = false;  // the choices gained kMinGain on the step (always on the GPU): else every kernel keeps its default
  double seconds = 0;
};

// The candidates for one op of `c` on a CPU Target with a team of `team` threads, the default first.
std::vector<KernelChoice> cpu_candidates(const Circuit& c, const Op& op, int team);

// The candidates for one op of `c` lowered for the GPU Target `t`, the default first: for a matmul
// (plain or fused) each `--matmul` key the kernel honours set one way at a time: the tensor-core
// kernels' block tile and stages, on wgmma also split-K, staged stores, products first and tensor
// copies; the FFMA kernel's tile. Every other op: the default only (the attention path and the
// row kernels' blocks are not candidates yet).
std::vector<KernelChoice> gpu_candidates(const Circuit& c, const Op& op, const Target& t);

// Tunes the distinct kernels of `optimized` (a plan's circuit, as optimize() made it for `target`)
// not already in `known`.
TuneReport tune_kernels(const Circuit& optimized, const Target& target, const TuneOptions& options,
                        const KernelChoices& known = {});

// `--tune on`: the plan of `recorded` (as optimize() makes it for `target`) has its kernels that
// neither target.tuned nor the device's tuning file holds tuned (default options, progress logged),
// the file updated; returns `target` with the file's choices and the new ones (less what an
// explicit thread count fixes).
Target tune_missing_kernels(const Circuit& recorded, const std::vector<ValueId>& requested, const Target& target,
                            const PipelineOptions& pipeline);

// The entries of a report's tuned kernels (skipped ones have none), for this kiln version: their
// choices, or the defaults where the report did not keep them.
std::vector<TuningEntry> tuning_entries(const TuneReport& report);

}  // namespace kiln
