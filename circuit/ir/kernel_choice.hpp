// Kernel choices per op: what the autotuner (core/tuning.hpp) measured to be fastest for one
// kernel of a plan on one device, applied by the executor and the Prims' references. A kernel
// is identified by its signature (kernel_signature: the Prim, its params, its inputs' and
// outputs' dtypes and shapes), so a choice holds for every op of every plan with that signature.
// The table lives in the Target (Target::tuned), so a plan made with other choices is another plan.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

class Circuit;
struct Op;
struct MatmulPolicy;

// One kernel's choices: the CPU references' and the GPU matmul kernels'. Every default is kiln's
// hand-picked choice (docs/BENCHMARKS.md); each candidate gives the default's result up to the
// order of its sums.
struct KernelChoice {
  // f32 matmuls: oneDNN's sgemm (Eigen's GEMM where kiln was built without oneDNN), Eigen's GEMM,
  // or oneDNN's matmul primitive (made once per plan op; one call for a whole batch).
  enum class Gemm : uint8_t { standard, eigen, onednn };
  Gemm gemm = Gemm::standard;
  int threads = 0;         // OpenMP threads the op runs on, at most the run's team; 0: the team
  int attention_rows = 0;  // causal attention's query rows per block (16-128); 0: 32
  int row_chunk = 0;       // fused_rows: rows per chunk of the row-block path; 0: 2048 / row length
  // GPU matmul kernels: `--matmul` keys applied over the Target's MatmulPolicy for this kernel
  // ("tile=128x256", several joined by '+'); empty: the Target's.
  std::string matmul;

  bool operator==(const KernelChoice&) const = default;
  bool is_default() const { return *this == KernelChoice{}; }
  // "gemm=eigen,threads=1" or "matmul=tile=128x256+stages=3": the non-default keys; "default"
  // where there are none.
  std::string str() const;
  // The inverse of str(); throws kiln::Error naming the key and what it expects.
  static KernelChoice parse(std::string_view text);
  // `base` with this choice's matmul keys applied.
  MatmulPolicy matmul_policy(const MatmulPolicy& base) const;
};

// Op signature -> choice, for one device. Immutable and shared by the Targets that hold it;
// compared by content.
class KernelChoices {
 public:
  using Map = std::map<std::string, KernelChoice>;
  KernelChoices() = default;
  explicit KernelChoices(Map entries);

  const KernelChoice* find(const std::string& signature) const;  // null where none is recorded
  const Map& entries() const;
  size_t size() const { return map_ ? map_->size() : 0; }
  bool empty() const { return size() == 0; }
  bool operator==(const KernelChoices& o) const { return entries() == o.entries(); }
  // 8 hex digits of a hash of every entry: tells two tables apart in a log line.
  std::string fingerprint() const;

 private:
  std::shared_ptr<const Map> map_;
};

// "matmul ta=1 tb=0 f32[1024,512] f32[1024,128] -> f32[512,128]": the Prim, its description (a
// long one, such as a fused body, shortened and followed by a hash of the whole), its inputs'
// and outputs' dtypes and shapes. Equal signatures: the same kernel on the same data sizes.
std::string kernel_signature(const Circuit& c, const Op& op);

}  // namespace kiln
