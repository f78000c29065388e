// Builder: typed helpers that append ops to a Circuit under a scope (the module path that is
// recording). VJP rules, composites and core's Tensor all record through it.
#pragma once

#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

class Builder {
 public:
  Builder(Circuit& c, std::string scope = {}) : c_(c), scope_(std::move(scope)) {}
  Circuit& circuit() { return c_; }
  const std::string& scope() const { return scope_; }
  const ValueInfo& info(ValueId v) const { return c_.info(v); }
  ValueId op(PrimId prim, Params params, std::vector<ValueId> inputs);

  // out = body(in0, in1, ...) with numpy broadcasting; all inputs of one float dtype.
  ValueId pointwise(const ScalarExp& body, std::vector<ValueId> inputs);
  ValueId add(ValueId a, ValueId b);
  ValueId sub(ValueId a, ValueId b);
  ValueId mul(ValueId a, ValueId b);
  ValueId div(ValueId a, ValueId b);
  ValueId scale(ValueId a, double s);

  // Reduction along `axis`, keeping it as a dim of 1.
  ValueId reduce(ReduceKind kind, ValueId x, int axis);
  // Reduction over every axis to a scalar (shape []); Sum or Mean.
  ValueId reduce_all(ReduceKind kind, ValueId x);
  // a: [..., M, K] (ta: [..., K, M]), b: [..., K, N] (tb: [..., N, K]) -> [..., M, N].
  ValueId matmul(ValueId a, ValueId b, bool ta = false, bool tb = false);
  // table: [V, D], idx: i32 S -> S + [D].
  ValueId gather_rows(ValueId table, ValueId idx);
  // x: (..., V) float, idx: i32 (...) -> (..., 1): x[..., idx[...]] (one element of each row).
  ValueId gather_last(ValueId x, ValueId idx);
  // idx: i32 S, src: S + [D] -> [rows, D], zeros plus src rows added at idx.
  ValueId scatter_add_rows(ValueId idx, ValueId src, int64_t rows);
  // idx: i32 S -> S + [depth] of dtype, 1 at idx and 0 elsewhere.
  ValueId one_hot(ValueId idx, int64_t depth, DType dtype);
  ValueId reshape(ValueId x, const Shape& shape);
  ValueId permute(ValueId x, const std::vector<int64_t>& perm);
  ValueId transpose(ValueId x, int a, int b);
  ValueId broadcast(ValueId x, const Shape& shape);
  // x[..., start:end, ...] along axis.
  ValueId slice(ValueId x, int axis, int64_t start, int64_t end);
  ValueId concat(const std::vector<ValueId>& xs, int axis);
  // x cut along axis into consecutive pieces of the given sizes (one op, one output each).
  std::vector<ValueId> split(ValueId x, int axis, const std::vector<int64_t>& sizes);
  // cond (any dtype, nonzero = true) ? a : b, broadcasting all three.
  ValueId where(ValueId cond, ValueId a, ValueId b);
  ValueId cast(ValueId x, DType dtype);
  ValueId stop_gradient(ValueId x);
  ValueId fill(const Shape& shape, DType dtype, double value);
  // value at each coordinate = index(coords), converted to dtype.
  ValueId iota(const Shape& shape, DType dtype, const IndexExp& index);
  // key: i32 [2] (seed lo, hi), offset: i32 [] (runtime inputs); p: Bernoulli keep probability.
  ValueId random(RandomKind kind, const Shape& shape, DType dtype, ValueId key, ValueId offset, double p = 0.5);
  // Writes value into the persistent buffer `target`; the result is the buffer's new version.
  ValueId assign(ValueId target, ValueId value);

 private:
  Circuit& c_;
  std::string scope_;
};

}  // namespace kiln
