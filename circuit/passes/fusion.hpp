// Fusion passes: Circuit -> Circuit rewrites that merge ops into fewer, larger ones, so that the
// Eigen executor makes fewer passes over memory and the GPU back end launches fewer kernels.
// Legality: a producer is absorbed only into its single consumer, only when its
// result is not protected (a requested output, an external, or a value something else reads,
// such as a saved activation), and only when both compute over the same index domain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

// Shared by fuse_pointwise and fuse_rows: moving the producer of a value of kLargeValueBytes or
// more past a product keeps the producer's inputs live across that product, memory the plan had
// free (the chunked loss's running sum of weight gradients would keep every chunk's partial sum to
// the end), so neither pass does it. matmuls_before_each_op(c)[i] counts the products (matmul,
// fused_matmul) among ops [0, i); it has ops().size() + 1 entries.
inline constexpr size_t kLargeValueBytes = size_t{64} << 20;
inline std::vector<int32_t> matmuls_before_each_op(const Circuit& c) {
  const auto& ops = c.ops();
  std::vector<int32_t> before(ops.size() + 1, 0);
  for (size_t i = 0; i < ops.size(); ++i)
    before[i + 1] = before[i] + (ops[i].is(PrimId::matmul) || ops[i].is(PrimId::fused_matmul) ? 1 : 0);
  return before;
}

// Attention as a Prim before differentiation (fuse_attention.cpp states the exact pattern): q kᵀ,
// the causal mask (or none), an additive mask, softmax over the keys, dropout and the product
// with v, recorded in c, become one attention op in place, with the scale on q, the heads'
// permutes, grouped-query repeats and a fused projection's split where only the chain reads
// them. Every value id stays valid (Circuit::replace_ops), so Engine::backward runs it on the
// recording before the reverse sweep (Engine::grad does not: its results may be differentiated
// again, and attention_grad has no VJP), which then records attention's own VJP (attention_grad,
// which recomputes the probabilities from the row log-sum-exp: no (T, T) value remains). A chain
// whose intermediates an op outside it reads or `keep` names (the loss, live handles, `wrt`), or
// whose additive mask depends on a value of `wrt` (attention gives the mask no gradient), stays
// as recorded. It runs before CSE: an intermediate read twice by the same op recorded twice
// (p v computed twice) keeps the chain too. Returns the number of attention ops made.
size_t fuse_attention_in_place(Circuit& c, const std::vector<ValueId>& keep, const std::vector<ValueId>& wrt = {});
// The pipeline's pass: the same on a copy, for chains that no backward followed (an evaluation
// step); `outputs` are kept. Run before fuse_pointwise (which would merge the chain's pointwise
// ops into others).
Circuit fuse_attention(const Circuit& c, std::vector<ValueId>& outputs);

// Chains and trees of pointwise ops become one pointwise op whose body composes theirs: a
// pointwise producer whose result only one pointwise consumer reads, with the consumer's
// output shape, is substituted into the consumer's body (its inputs join the consumer's,
// broadcast as before). Iterates to a fixpoint in one topological sweep; deterministic. A
// pointwise op left reading float fills only is folded into a fill (evaluated in f64, rounded
// once to its dtype). `outputs` are rewritten to their ids in the result.
Circuit fuse_pointwise(const Circuit& c, std::vector<ValueId>& outputs);

// Matmul fusion: each matmul becomes a fused_matmul (circuit/prims/fused_matmul.hpp) where that
// saves work. Its operands are read in place through the moves in front of it (reshape,
// permute, slice, split, broadcast) while the view stays affine, and through unary pointwise
// ops (applied as a prologue on load); a buffer something assigns is never read through. The
// pointwise ops over its output domain that read its values become epilogues (bias, GELU,
// residual add, GELU backward, scaling), absorbed one at a time to a fixpoint, in the matmul's
// phase only, never when a path leaves the group and comes back, and never a value a reduction
// along the last axis reads (a row pattern's part, which fuse_rows computes inside its row
// kernel instead of reading it back); each absorbed value that
// something else reads (or a requested output) is an output of the op. A single result that
// only a permute reads is stored permuted. Deterministic; run after fuse_pointwise. Casts of
// operands to bf16 become prologues only where the Target's matmul policy has no bf16 mma.
Circuit fuse_matmul(const Circuit& c, std::vector<ValueId>& outputs, const Target& target);

// Column fusion: each sum along axis 0 of an [N, C] value (through a reshape that keeps C: a sum
// over the token axes, as a layernorm's parameter gradients and biases' gradients are) whose
// pointwise producer only it reads absorbs that producer into a column_sums op; sums over one
// domain in one phase that share an input join into one such op (never when a path would leave
// the group and come back). A lone sum with nothing absorbed stays a reduce. Deterministic; run
// after fuse_pointwise and before fuse_matmul (which would take the producer as an epilogue).
Circuit fuse_columns(const Circuit& c, std::vector<ValueId>& outputs);

// Row-epilogue fusion: a reduction along the last axis of a domain (rows..., n) and the
// pointwise, where, broadcast and stop_gradient ops around it over the same rows (with the
// domain's shape or its per-row shape (rows..., 1)) become one fused_rows op, together with
// any other such reductions they connect to: softmax, masked softmax, layernorm forward and
// backward, cross-entropy with its gradient. Float fills become constants. A member whose
// value something outside the group reads (or a requested output) is written; the others
// (probabilities, centred rows, ...) are recomputed per phase, never stored. Groups grow along
// edges to a fixpoint, in op order; a join is refused when a path would leave the group and
// come back (through other ops or groups), which keeps the graph of groups acyclic, and
// buffer reads stay before the assigns that overwrite them. Run after fuse_pointwise.
Circuit fuse_rows(const Circuit& c, std::vector<ValueId>& outputs);

// Multi-tensor merge: the same elementwise work over many tensors, as an optimizer records it
// per parameter, becomes one multi_tensor op (one launch over all of them). Candidates are
// update-phase ops only (never forward or backward work glued together): pointwise ops,
// element groups of fuse_rows, and reduce_all sums with the pointwise body only they read
// (gradient-norm clipping), each over a domain whose inputs have its shape or one element.
// Candidates with the same program (bodies, dtype, which inputs are scalars) that neither
// reaches the other merge; an input that is the same scalar in all becomes a shared input.
// One program at a time, to a fixpoint; deterministic. Run after the other fusion passes.
Circuit merge_multi_tensor(const Circuit& c, std::vector<ValueId>& outputs);

}  // namespace kiln
