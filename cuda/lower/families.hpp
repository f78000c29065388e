// The lowering table and one registration function per Prim family: cuda/lower/<family>.cpp
// lowers the Prims that circuit/prims/<family>.cpp defines. Registration is explicit, as the
// Prims' own is (a static library would drop static initializers). Internal to cuda/lower/.
#pragma once

#include <array>

#include <kiln/cuda/lower/lower.hpp>

namespace kiln::cuda {

class LoweringTable {
 public:
  using LowerFn = LoweredOp (*)(const Circuit& c, const Op& op, const Target& target);
  struct Entry {
    LowerFn fn = nullptr;  // nullptr: no kernel, output 0 is input `alias_of`'s buffer
    int alias_of = -1;
    const char* summary = nullptr;  // for `kiln prims`; nullptr: not registered
  };

  // Each Prim is registered once; a second registration is a bug and throws.
  void add(PrimId prim, LowerFn fn, const char* summary);
  void add_alias(PrimId prim, int input, const char* summary);
  const Entry& at(PrimId prim) const { return entries_[static_cast<size_t>(prim)]; }

 private:
  void set(PrimId prim, Entry e);
  std::array<Entry, kPrimCount> entries_{};
};

void register_pointwise_lowering(LoweringTable& t);     // pointwise
void register_reduce_lowering(LoweringTable& t);        // reduce, reduce_all
void register_matmul_lowering(LoweringTable& t);        // matmul
void register_gather_lowering(LoweringTable& t);        // gather_rows, scatter_add_rows, gather_last, one_hot
void register_shape_ops_lowering(LoweringTable& t);     // reshape, permute, broadcast
void register_slice_concat_lowering(LoweringTable& t);  // slice, concat, split
void register_where_lowering(LoweringTable& t);         // where
void register_cast_lowering(LoweringTable& t);          // cast, stop_gradient
void register_constants_lowering(LoweringTable& t);     // fill, iota
void register_random_lowering(LoweringTable& t);        // random
void register_assign_lowering(LoweringTable& t);        // assign
void register_fused_rows_lowering(LoweringTable& t);    // fused_rows
void register_multi_tensor_lowering(LoweringTable& t);  // multi_tensor
void register_fused_matmul_lowering(LoweringTable& t);  // fused_matmul
void register_column_sums_lowering(LoweringTable& t);   // column_sums
void register_attention_lowering(LoweringTable& t);     // attention, attention_grad
void register_all_reduce_lowering(LoweringTable& t);    // all_reduce, reduce_scatter, all_gather

inline void register_all_lowerings(LoweringTable& t) {
  register_pointwise_lowering(t);
  register_reduce_lowering(t);
  register_matmul_lowering(t);
  register_gather_lowering(t);
  register_shape_ops_lowering(t);
  register_slice_concat_lowering(t);
  register_where_lowering(t);
  register_cast_lowering(t);
  register_constants_lowering(t);
  register_random_lowering(t);
  register_assign_lowering(t);
  register_fused_rows_lowering(t);
  register_multi_tensor_lowering(t);
  register_fused_matmul_lowering(t);
  register_column_sums_lowering(t);
  register_attention_lowering(t);
  register_all_reduce_lowering(t);
}

}  // namespace kiln::cuda
