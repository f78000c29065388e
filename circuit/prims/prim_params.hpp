// Typed views of the Params of the Prims whose parameters are read outside their own family
// (by passes, the GPU lowering, the Builder). Each view is the one place that knows its Prim's
// Params layout: `of` reads an op's params (the op must be of that Prim), `to_params` builds
// them. Defined beside the family, in circuit/prims/<family>.cpp. No other code indexes
// Params::ints by position.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <vector>

#include <kiln/circuit/ir/prim.hpp>

namespace kiln {

struct Op;

// Throws kiln::Error unless op is one of `prims` (a view read from the wrong op is a bug).
void require_view_of(const Op& op, std::initializer_list<PrimId> prims, const char* view);

enum class ReduceKind : int64_t { Sum = 0, Max = 1, Mean = 2 };
// A reduction kind's semantics, written once for every CPU reference (reduce, reduce_all,
// fused_rows) and the GPU lowering's names and identities: its name in dumps, the accumulator's
// starting value, how an element joins it (max propagates NaN: a NaN anywhere in the row gives
// NaN, as the GPU kernels' max does), and how the accumulator finishes (mean divides by the count).
const char* reduce_kind_name(ReduceKind kind);
template <class T>
T reduce_identity(ReduceKind kind) {
  return kind == ReduceKind::Max ? -std::numeric_limits<T>::infinity() : T(0);
}
template <class T>
T reduce_combine(ReduceKind kind, T acc, T v) {
  if (kind != ReduceKind::Max) return acc + v;
  return std::isnan(acc) || !(v > acc || std::isnan(v)) ? acc : v;
}
template <class T>
T reduce_finish(ReduceKind kind, T acc, int64_t count) {
  return kind == ReduceKind::Mean ? acc / static_cast<T>(count) : acc;
}
enum class RandomKind : int64_t { Uniform = 0, Normal = 1, Bernoulli = 2 };

// reduce {kind, axis}; reduce_all {kind} (axis -1).
struct ReduceParams {
  ReduceKind kind = ReduceKind::Sum;
  int axis = -1;
  static ReduceParams of(const Op& op);
  Params to_params() const;
  // Is op a reduce summing along `axis`? (false for any other op)
  static bool is_sum_along(const Op& op, int axis);
};

// matmul {transpose_a, transpose_b}.
struct MatmulParams {
  bool transpose_a = false, transpose_b = false;
  static MatmulParams of(const Op& op);
  Params to_params() const;
};

// all_reduce {} (whole: start and finish in one op) or {stage}. The overlap_collectives pass
// splits a CPU plan's all_reduce into a start, as soon as its bucket is made, and a finish, just
// before the bucket's first reader, so that the collective runs while the backward goes on.
enum class AllReduceStage : int64_t { whole = 0, start = 1, finish = 2 };
// all_reduce, reduce_scatter, all_gather: ops that talk to the other ranks. They are never run
// twice (the tuner times no such op), never recomputed, and may fail (a rank that died).
bool is_collective(const Op& op);
struct AllReduceParams {
  AllReduceStage stage = AllReduceStage::whole;
  static AllReduceParams of(const Op& op);
  Params to_params() const;
};

// scatter_add_rows {rows} or {rows, 1}: `ordered` asks the GPU to add in source order.
struct ScatterAddRowsParams {
  int64_t rows = 0;
  bool ordered = false;
  static ScatterAddRowsParams of(const Op& op);
  Params to_params() const;
};

// one_hot {depth}, dtype.
struct OneHotParams {
  int64_t depth = 0;
  DType dtype = DType::f32;
  static OneHotParams of(const Op& op);
  Params to_params() const;
};

// permute {perm...}: output dim e is input dim perm[e].
struct PermuteParams {
  std::vector<int64_t> perm;
  static PermuteParams of(const Op& op);
  Params to_params() const;
};

// slice {axis, start, end}.
struct SliceParams {
  int axis = 0;
  int64_t start = 0, end = 0;
  static SliceParams of(const Op& op);
  Params to_params() const;
};

// concat {axis}.
struct ConcatParams {
  int axis = 0;
  static ConcatParams of(const Op& op);
  Params to_params() const;
};

// split {axis, size_0, size_1, ...}.
struct SplitParams {
  int axis = 0;
  std::vector<int64_t> sizes;
  static SplitParams of(const Op& op);
  Params to_params() const;
};

// random {kind, shape...}, reals {probability}, dtype.
struct RandomParams {
  RandomKind kind = RandomKind::Uniform;
  Shape shape;
  double probability = 0.0;  // Bernoulli's p
  DType dtype = DType::f32;
  static RandomParams of(const Op& op);
  Params to_params() const;
};

// fill {shape...}, reals {value}, dtype.
struct FillParams {
  Shape shape;
  double value = 0.0;
  DType dtype = DType::f32;
  static FillParams of(const Op& op);
  // The fill that produces v, or nothing (an external, another Prim's output). Passes that fold
  // constants ask this; they check the dtype and value they can take.
  static std::optional<FillParams> producing(const Circuit& c, ValueId v);
  // The value of an f32 or f64 fill that produces v (a constant a scalar expression can take),
  // or nothing.
  static std::optional<double> float_value(const Circuit& c, ValueId v);
  Params to_params() const;
};

// column_sums {domain dims...}, bodies (one per output), dtype.
struct ColumnSumsParams {
  Shape domain;
  std::vector<ScalarExp> bodies;
  DType dtype = DType::f32;
  static ColumnSumsParams of(const Op& op);
  Params to_params() const;
};

// attention, attention_grad {causal, heads_inside, packed_heads, kv_groups, mask, bf16, bf16_copies},
// {scale, keep}. heads_inside: q, k, v,
// o and their gradients are (B, T, H, d), as a projection's output split into heads is before
// its permute; otherwise (..., T, d) with the heads among the batch dims. packed_heads H > 0
// (heads inside only): q, k and v are one input, a fused projection's (B, T, 3 H d) output with
// q, k, v side by side along the last axis, and attention_grad gives their gradients as one
// output of that shape.
// kv_groups G > 1 (grouped-query attention; not with heads inside): q is (B, H, T, d) and k, v
// are (B, H / G, T, d), query head h reading key/value head h / G.
// mask: an additive mask on the scores, an input right after q, k, v (before the dropout
// stream), of the scores' dtype, broadcastable (numpy rules) to the scores' shape: (batch...,
// Tq, Tk), or (B, H, Tq, Tk) with heads inside.
// bf16 (f32 q, k, v only): bf16 operands, for the bf16 precision policy's chain: the ops read q,
// k, v and do rounded to bf16 and compute in f32 from there (circuit/prims/attention.cpp).
// bf16_copies (f32 ops only; absorb_casts): after its outputs the op also writes each main output
// (attention: o; attention_grad: dq, dk, dv, or the packed gradient) rounded to bf16 as a cast
// rounds, for the matmuls that read them under the bf16 policy.
// keep < 1: dropout on the probabilities, which the ops take two more inputs for (key, offset,
// right after q, k, v and the mask): probability (i, j) of batch entry e is kept, times 1 / keep, where a
// random Bernoulli(keep) tensor of the probabilities' shape drawn with (key, offset) holds 1 at
// element (e Tq + i) Tk + j (composite::dropout's bits), and is 0 otherwise.
struct AttentionParams {
  bool causal = false;
  double scale = 1.0;
  bool heads_inside = false;
  int64_t packed_heads = 0;
  int64_t kv_groups = 1;
  double keep = 1.0;
  bool mask = false;
  bool bf16 = false;
  bool bf16_copies = false;
  bool dropout() const { return keep < 1.0; }
  static AttentionParams of(const Op& op);
  Params to_params() const;
};

}  // namespace kiln
