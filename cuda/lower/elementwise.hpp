// The generic elementwise kernel that most families lower to, and the reduction steps shared by
// the reducing lowerings (reduce.cpp defines those). Internal to cuda/lower/.
#pragma once

#include <functional>

#include <kiln/circuit/prims/builder.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

// How a kernel operand is addressed: element offset = base + sum_k coord_k * strides[k] over
// the coordinates of the index domain; `arg` is the kernel parameter holding the buffer.
struct Access {
  int arg = 0;
  DType dtype = DType::f32;
  std::vector<int64_t> strides;
  int64_t base = 0;
  int64_t elements = 0;  // of the whole buffer (chooses the index type)
};
Access access_of(int arg, const ValueInfo& info, std::vector<int64_t> strides, int64_t base = 0);

// Computes the stored value from the loaded operands (in their own types), the domain
// coordinates (empty unless needed) and the kernel's buffer parameters.
using ValueFn = std::function<Reg(KernelBuilder& b, const std::vector<Reg>& loaded, const std::vector<Reg>& coords,
                                  const std::vector<Reg>& params)>;

// for each element of `domain`: store(value(loads)). One u64 buffer parameter per ArgRef.
Launch elementwise_launch(const Target& target, const std::string& prefix, const Shape& domain,
                          std::vector<ArgRef> args, const std::vector<Access>& loads, const Access& store,
                          const ValueFn& value, bool value_needs_coords = false);

// Finishes a kernel (checked), names it by prefix and structural hash, and wraps it in a Launch.
Launch finish_launch(KernelBuilder& b, const std::string& prefix, kir::Dim3 grid, kir::Dim3 block,
                     std::vector<ArgRef> args);

// Status words (see lower.hpp): count one index error and keep the offending index.
void record_index_error(KernelBuilder& b, Reg status, Reg index);

// The kernel arguments most lowerings use.
inline const ArgRef kIn0{ArgRef::Kind::Input, 0}, kIn1{ArgRef::Kind::Input, 1}, kIn2{ArgRef::Kind::Input, 2};
inline const ArgRef kOut0{ArgRef::Kind::Output, 0};

// The store-type register for a value computed in f32.
Reg to_store_type(KernelBuilder& b, DType dt, Reg f);
// A lowering of one launch, its summary followed by the launch's grid and block.
LoweredOp single_launch(Launch l, std::string summary);
// Copies input 0 read through `load` into output `to` written through `store` (arg 0 and 1).
Launch copy_launch(const Target& target, const std::string& prefix, const Shape& domain, ArgRef from, ArgRef to,
                   Access load, Access store);
// Output 0 (contiguous) = input 0 read with `strides` from `base` over the output's domain:
// permute, broadcast and slice as pure addressing.
LoweredOp strided_copy(const Circuit& c, const Op& op, const Target& target, std::vector<int64_t> strides,
                       int64_t base = 0);

// Reduction steps (reduce.cpp), f32: combine two partial values (sum or NaN-propagating
// max), the identity, a butterfly over the warp after which every lane holds the warp's value
// (full-mask shuffles: every lane must reach it), and mean's division by n.
Reg reduce_combine(KernelBuilder& b, ReduceKind kind, Reg acc, Reg x);
Operand reduce_identity_operand(ReduceKind kind);
Reg warp_reduce(KernelBuilder& b, ReduceKind kind, Reg acc);
Reg reduce_finalize(KernelBuilder& b, ReduceKind kind, Reg v, int64_t n);
// Combines `acc` over the block's `threads` (a multiple of 32); `emit_result(v)` is emitted
// where thread 0 holds the block's value. Every thread must reach it (a barrier and shuffles
// inside); only the final use is guarded.
void block_reduce(KernelBuilder& b, ReduceKind kind, Reg acc, uint32_t threads,
                  const std::function<void(Reg)>& emit_result);
// For a grid of `blocks` blocks whose threads each wrote partial results: after a bar.sync,
// thread 0 counts its block in (u32 atomic add on `counter`, a zeroed u32, between two
// membar.gl: release of the block's partials, acquire of the earlier blocks'), and the block
// that arrives last runs `finish` with every thread (after a second bar.sync), so partials are
// combined in one launch, in an order fixed by the code, not by scheduling. Every thread calls it.
void after_last_block(KernelBuilder& b, Reg counter, uint32_t blocks, const std::function<void()>& finish);

}  // namespace kiln::cuda
