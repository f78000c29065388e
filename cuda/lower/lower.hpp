// Lowering: each Circuit op becomes zero or more kernel launches of kernel IR. Shapes are known
// when a plan is built, so kernels are specialized to them (sizes, strides and constants are
// immediates; the only kernel parameters are buffer addresses). Grid and block are chosen here,
// per op, and shown in the dump of lowered kernels; the Circuit knows nothing of the GPU.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>
#include <kiln/cuda/kir/kir.hpp>
#include <kiln/cuda/lower/rank_collective.hpp>

namespace kiln::cuda {

// Where a kernel parameter's address comes from.
struct ArgRef {
  enum class Kind : uint8_t {
    Input,    // the op's input `index`
    Output,   // the op's output `index`
    Scratch,  // the op's temporary buffer `index` (LoweredOp::scratch_bytes)
    Status,   // the program's status words (u32[2]): index errors found on the device
    // the global address of the tensor map LoweredOp::tensor_maps[index], which the program
    // encodes over its input's buffer before the launches
    TensorMap,
  } kind = Kind::Input;
  int index = 0;
};

// A tensor map for cp.async.bulk.tensor (kir::Opc::TensorCopy): input `input`'s elements from
// `offset` on as a tensor of dims (innermost first) with byte strides for dims 1.., and the box a
// copy moves, in 128-byte swizzled rows or plain ones. Elements outside the tensor read as zero.
struct TensorMapArg {
  int input = 0;
  uint32_t element_bytes = 2;
  int64_t offset = 0;  // elements
  std::vector<uint64_t> dims;
  std::vector<uint64_t> strides;  // bytes, one a dimension after the first
  std::vector<uint32_t> box;
  bool swizzle_128 = true;
};

struct Launch {
  std::shared_ptr<const kir::Kernel> kernel;
  kir::Dim3 grid, block;
  std::vector<ArgRef> args;  // one per kernel parameter, in order
};

struct LoweredOp {
  // >= 0: output 0 shares this input's buffer and there is no launch (reshape, stop_gradient:
  // input 0; assign: input 1, the new contents, which the program commits at the end).
  int alias_of = -1;
  // Outputs set to zero before the launches (scatter_add_rows accumulates into zeros).
  bool zero_outputs = false;
  std::vector<size_t> scratch_bytes;
  std::vector<size_t> zeroed_scratch;  // scratch buffers set to zero before the launches (counters)
  std::vector<Launch> launches;
  // The collective between ranks the device program adds with the process's device collective
  // (cuda/runtime/collective.hpp). all_reduce_mean: in place on output 0 after the launches (NCCL),
  // or from input 0 into output 0 instead of them (host staged). reduce_scatter_mean and
  // all_gather (ZeRO-1 over several ranks): from input 0 into output 0, with no launches.
  RankCollective collective = RankCollective::none;
  std::vector<TensorMapArg> tensor_maps;  // those ArgRef::Kind::TensorMap names
  std::string summary;                    // "matmul tile 64x64x16, 256 threads"
};

// Status word 0 counts index errors; word 1 holds one offending index. A kernel that checks
// indices (gather_rows, scatter_add_rows, one_hot) writes them; the program reads them after
// the run and raises an error naming the op.
constexpr int kStatusWords = 2;

// Lowers op `op_index` of `c` for `target` (a CUDA Target: its sm, its matmul policy, ...).
// Throws kiln::Error naming the op for what has no lowering (f64 and f16 tensors).
LoweredOp lower(const Circuit& c, int op_index, const Target& target);

// The input whose buffer the result of a Prim that launches nothing uses (reshape and
// stop_gradient: 0; assign: 1, its new contents), or -1. Independent of dtypes.
int alias_input(PrimId prim);

// One line per Prim for `kiln prims`: how it lowers ("" when it has no lowering).
std::string lowering_summary(PrimId prim);

// A user Prim's own kernels (core/user_prim.hpp registers them with the Prim): given a plan's op of
// that Prim, its launches of kernel IR, as kiln's lowerings in cuda/lower/ make them. lower()
// checks what it returns (a kernel per launch, one argument per kernel parameter, each naming an
// input, output or scratch buffer the op has) and names the Prim when it does not hold.
using UserLowering = std::function<LoweredOp(const Circuit& c, const Op& op, const Target& target)>;
void register_user_lowering(const PrimDef& prim, UserLowering lowering);

}  // namespace kiln::cuda
