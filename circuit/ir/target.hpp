// The Target: everything that decides how a plan is optimized, lowered and run on one device,
// made once per device (Engine::set_device) and passed down as a value. Passes and lowering are
// functions of (circuit, op, Target): none of them reads a global, an environment variable or the
// engine to find a choice. A Target is part of every plan's key (core/plan_cache.hpp), so plans
// made for two Targets are two plans.
//
// The device fields (kind, sm, fake, cpu) come from the device; the choices (precision policy,
// matmul policy, attention path, ...) from the user: `kiln train|bench|ptx` options parsed by
// parse_matmul_policy and friends, or a program's own code. Defaults are kiln's measured choices
// (docs/BENCHMARKS.md).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <kiln/circuit/ir/kernel_choice.hpp>

namespace kiln {

// The x86 features the CPU kernels may use (cpuid; all false elsewhere).
struct CpuFeatures {
  bool avx2 = false, fma = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
  bool operator==(const CpuFeatures&) const = default;
};
CpuFeatures detect_cpu_features();

// Which wgmma matmul outputs go out through shared memory (StagedStores, cuda/lower/matmul.hpp):
// none (the default: no GPU has timed the others yet); those whose rows start at odd elements
// (GPT-2's logits); all, also rows and batch items of whole 16-byte chunks.
enum class MmaStaging { none, odd_rows, all };

// The GPU matmul kernels' choices. Unset fields (0, nullopt) leave the choice to the kernel's
// rules per shape (cuda/lower/matmul_tiling.cpp).
struct MatmulPolicy {
  int simt_tile = 0;     // the FFMA / tf32-FFMA kernel's square tile: 64 or 128; 0 per shape
  bool bf16_mma = true;  // bf16 operands on mma tensor cores (false: the FFMA kernel, widened to f32)
  // The tensor-core (mma.sync, wgmma) kernel's block tile: tile_n > 0 its columns (128 or 256;
  // tile_m 192 with 256 columns on wgmma), kTileAuto (128x256 where its grid fills the SMs),
  // kTileWaves (wgmma: fewest whole waves), 0 unset (mma.sync 128x128, wgmma auto).
  static constexpr int kTileAuto = -1, kTileWaves = -2;
  int tile_m = 128, tile_n = 0;
  int stages = 0;              // cp.async stages, 2-4; 0 the kernel's default (2; wgmma 4)
  std::optional<int> split_k;  // 0 none, -1 auto, 2-4; unset: auto on wgmma, none on mma.sync
  std::optional<bool> wgmma;   // bf16 products on sm_90a's wgmma; unset: the device decides
  MmaStaging staged_stores = MmaStaging::none;
  bool products_first = false;  // wgmma: a k step's products before its copies of a later step
  bool tensor_copies = false;   // wgmma without a batch: stages filled by cp.async.bulk.tensor
  bool operator==(const MatmulPolicy&) const = default;
};

enum class AttentionPath { mma, simt };  // bf16 attention on mma.sync (default) or FFMA kernels

// How CPU plans multiply bf16 operands. Each gives the products of the operands rounded to bf16,
// summed in f32; they differ in the order of the sums only.
enum class CpuBf16Products {
  rounded_f32,  // bf16 values held in f32, rounded to bf16 (passes/bf16_as_rounded_f32.hpp); f32 GEMMs
  onednn,       // bf16 storage; oneDNN's bf16 matmul: AMX tiles or AVX512-BF16 (prims/onednn_matmul.hpp)
};

struct Target {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int sm = 0;         // CUDA compute capability x 10 (80, 90); 0 on the CPU
  bool fake = false;  // CUDA on the fake driver: kernels run in the SIMT simulator
  CpuFeatures cpu;    // the host's (plans run on the CPU executor wherever the device is not CUDA)

  // Precision policy: f32 matmuls round their operands to tf32 on tensor cores (default off, as
  // PyTorch). bf16 is the model's choice (casts recorded in the circuit), not the Target's.
  bool tf32 = false;
  MatmulPolicy matmul;
  AttentionPath attention = AttentionPath::mma;
  // cpu_target() chooses: onednn where the CPU has AMX-BF16 and kiln has oneDNN (timed on one:
  // docs/BENCHMARKS.md), rounded_f32 elsewhere (AVX512-BF16 alone is untimed); `--cpu-bf16` overrides.
  CpuBf16Products cpu_bf16 = CpuBf16Products::rounded_f32;
  bool wide_indices = false;   // every kernel indexes with 64 bits (tests of the u64 paths)
  bool deterministic = false;  // no float atomics; on the CPU a fixed thread count
  bool cuda_graphs = true;     // replay a step's launches as a CUDA graph where the driver can
  // The CPU executor stores an output over an input that dies at its op, where the Prim's
  // reference allows it (PrimDef::may_overwrite): less workspace, the same results bit for bit.
  bool cpu_overwrite_inputs = true;
  // The autotuner's measured choices per kernel (core/tuning.hpp; `--tune`); empty: the defaults.
  KernelChoices tuned;

  bool operator==(const Target&) const = default;
  bool gpu() const { return kind == Kind::cuda; }
  // bf16 matmuls on wgmma: the policy's choice, else a real sm_90 GPU's (the fake driver, though
  // it reports sm_90, runs mma.sync unless asked: the simulator runs both).
  bool wgmma() const { return matmul.wgmma.value_or(kind == Kind::cuda && sm == 90 && !fake); }
  // One line: "cuda sm_90 (fake) f32 matmul{...} attention=mma ... tuned=12" (--stats, metrics logs).
  std::string str() const;
};

// The host's Target: Kind::cpu with its features, and the bf16 products they make fastest
// (cpu_bf16: default_cpu_bf16 of the features and of whether kiln was built with oneDNN).
Target cpu_target();
// oneDNN's bf16 products where the CPU has AMX-BF16 and kiln has oneDNN, else rounded f32.
CpuBf16Products default_cpu_bf16(const CpuFeatures& cpu, bool have_onednn);
// A CUDA device's Target; the choices keep their defaults.
Target cuda_target(int sm, bool fake);
// `to` with the device fields of `device` (kind, sm, fake, cpu) and its own choices.
Target with_device_of(Target to, const Target& device);

// "tile=192x256,stages=4,split-k=auto,..." (the `--matmul` option) applied to `base`. Keys:
// simt-tile=64|128, bf16-mma=on|off, tile=128x128|128x256|192x256|auto|waves, stages=2|3|4,
// split-k=0|auto|2|3|4, wgmma=on|off, staged-stores=none|odd|all, products-first=on|off,
// tensor-copies=on|off. Throws kiln::Error naming the key and what it expects.
MatmulPolicy parse_matmul_policy(std::string_view text, MatmulPolicy base = {});
std::string matmul_policy_str(const MatmulPolicy& p);       // the non-default keys, in the same syntax
AttentionPath parse_attention_path(std::string_view text);  // "mma" | "simt" (`--attention-path`)
CpuBf16Products parse_cpu_bf16(std::string_view text);      // "rounded-f32" | "onednn" (`--cpu-bf16`)
const char* cpu_bf16_name(CpuBf16Products p);               // the same names
// What the CPU does with bf16 products, for `kiln train` and `kiln bench` ("CPU bf16: ..."):
// "AMX" or "AVX512-BF16" (oneDNN's kernels chosen), "none: bf16 is emulated and slower than f32"
// (a CPU without bf16 arithmetic), or "none used: ..." naming what the CPU has. `warn`: emulated.
std::string cpu_bf16_summary(const Target& t, bool* warn = nullptr);

}  // namespace kiln
