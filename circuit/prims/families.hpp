// One registration function per Prim family (one source file each under circuit/prims/).
// Registration is explicit, not by static initializers, which a static library would drop.
// Each line lists its family's Prims; a parenthesis after a name says what makes it, for the
// Prims that no Builder method records (tests check both against the registry and builder.hpp).
#pragma once

namespace kiln {

class PrimRegistry;

void register_pointwise(PrimRegistry& r);     // pointwise
void register_reduce(PrimRegistry& r);        // reduce, reduce_all
void register_matmul(PrimRegistry& r);        // matmul
void register_gather(PrimRegistry& r);        // gather_rows, scatter_add_rows, gather_last, one_hot
void register_shape_ops(PrimRegistry& r);     // reshape, permute, broadcast
void register_slice_concat(PrimRegistry& r);  // slice, concat, split
void register_where(PrimRegistry& r);         // where
void register_cast(PrimRegistry& r);          // cast, stop_gradient
void register_constants(PrimRegistry& r);     // fill, iota
void register_random(PrimRegistry& r);        // random
void register_assign(PrimRegistry& r);        // assign
void register_fused_rows(PrimRegistry& r);    // fused_rows (built by the row fusion pass)
void register_multi_tensor(PrimRegistry& r);  // multi_tensor (built by the multi-tensor merge)
void register_fused_matmul(PrimRegistry& r);  // fused_matmul (built by the matmul fusion)
void register_column_sums(PrimRegistry& r);   // column_sums (built by the column fusion)
void register_attention(PrimRegistry& r);     // attention (made before differentiation), attention_grad (its VJP's)
void register_all_reduce(PrimRegistry& r);    // all_reduce (data parallelism), reduce_scatter (ZeRO-1), all_gather (ZeRO-1)

inline void register_all_prims(PrimRegistry& r) {
  register_pointwise(r);
  register_reduce(r);
  register_matmul(r);
  register_gather(r);
  register_shape_ops(r);
  register_slice_concat(r);
  register_where(r);
  register_cast(r);
  register_constants(r);
  register_random(r);
  register_assign(r);
  register_fused_rows(r);
  register_multi_tensor(r);
  register_fused_matmul(r);
  register_column_sums(r);
  register_attention(r);
  register_all_reduce(r);
}

}  // namespace kiln
