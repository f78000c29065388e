// Prim: one kind of Circuit node. A PrimDef carries the node's shape rule, its Eigen reference
// semantics (f32 and f64) and its VJP rule; each Prim family defines these side by side in one
// file under circuit/prims/ and registers them here. Lowerings live in cuda/.
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <kiln/circuit/ir/eval_buffers.hpp>
#include <kiln/circuit/ir/host_tensor.hpp>
#include <kiln/circuit/ir/prim_id.hpp>
#include <kiln/circuit/ir/scalar_exp.hpp>
#include <kiln/circuit/ir/types.hpp>

namespace kiln {

using ValueId = int32_t;
constexpr ValueId kNoValue = -1;

struct ValueInfo {
  Shape shape;
  DType dtype = DType::f32;
  bool operator==(const ValueInfo& o) const { return shape == o.shape && dtype == o.dtype; }
  size_t nbytes() const { return static_cast<size_t>(shape.numel()) * dtype_size(dtype); }
};

// Compile-time parameters of an op; each Prim documents which fields it uses. Everything that
// changes from step to step is an input value instead, so that equal steps have equal params.
struct Params {
  std::vector<int64_t> ints;
  std::vector<double> reals;
  DType dtype = DType::f32;       // result dtype for cast, fill, iota, one_hot, random
  ScalarExp body;                 // pointwise body
  std::vector<ScalarExp> bodies;  // fused_rows: reduction bodies, then output bodies
  IndexExp index;                 // iota body

  bool operator==(const Params& o) const;
  uint64_t hash() const;
};

class Circuit;
struct Op;
struct PrimDef;

// Passed to shape rules so that their errors name the op and the layer.
struct ShapeCtx {
  const PrimDef& prim;
  const std::string& layer;
  [[noreturn]] void fail(const std::string& message) const;
  // Throws unless `info` has a floating-point dtype the Eigen executor runs.
  void require_float(const ValueInfo& info, const char* what) const;
  void require_dtype(const ValueInfo& info, DType dtype, const char* what) const;
  // Throws unless every dim of a shape given in params is >= 0.
  void require_dims(const std::vector<int64_t>& dims, const char* what) const;
};

// Given input infos and params, returns output infos or throws via ctx.fail.
using ShapeRule = std::function<std::vector<ValueInfo>(const ShapeCtx& ctx, const std::vector<ValueInfo>& inputs,
                                                       const Params& params)>;
// Reference semantics: computes the outputs into bufs.output(k) (or returns an input's storage,
// for the Prims that declare output_aliases) and returns them in order.
using EvalFn = std::function<std::vector<HostTensor>(const Op& op, const std::vector<const HostTensor*>& inputs,
                                                     EvalBuffers& bufs)>;
// Given the op and the gradient of each output (kNoValue where none reaches it), appends
// backward ops through the circuit's builder and returns one gradient per input (kNoValue
// for none). A returned gradient may have the op's broadcast shape: the reverse sweep, not
// the rule, reduces it to the input's shape and accumulates fan-out.
class Builder;
using VjpRule = std::function<std::vector<ValueId>(Builder& b, const Op& op, const std::vector<ValueId>& out_grads)>;
// Short text of the params for dumps, e.g. "axis=1 kind=sum".
using DescribeFn = std::function<std::string(const Params& params)>;
// Whether the Eigen reference may write output `output` over the memory of input `input` (the
// executor asks only where that input has the output's dtype and shape and nothing reads it
// after the op): true when every read of an element of the input comes before the write of the
// output's element at the same place, or in the coefficient-wise operation that writes it.
using OverwriteRule =
    std::function<bool(const Op& op, const std::vector<ValueInfo>& inputs, size_t output, size_t input)>;
// A user Prim's GPU lowering as a pointwise body over in0, in1, ... (its inputs), given the op's
// params: the plan for a GPU replaces the op with a pointwise op of this body.
using PointwiseBodyFn = std::function<ScalarExp(const Params& params)>;
// A user Prim's GPU lowering as row reductions and bodies: given the op's input infos and params,
// the params of the `fused_rows` op (circuit/prims/fused_rows.hpp, RowProgram::to_params) that
// the plan for a GPU puts in its place.
using RowBodyFn = std::function<Params(const std::vector<ValueInfo>& inputs, const Params& params)>;

struct PrimDef {
  PrimId id{};
  std::string name;    // prim_name(id), set by the registry
  std::string family;  // the source file under circuit/prims/ that registered it (set from __FILE__)
  ShapeRule shape;
  EvalFn eval;
  VjpRule vjp;  // empty: differentiating through this Prim fails loudly
  DescribeFn describe;
  bool ref_f32 = true, ref_f64 = true;  // Eigen reference implemented for these dtypes
  bool side_effect = false;             // writes a persistent buffer (assign): never removed
  // The input whose storage output 0 is (reshape, stop_gradient: 0; assign: 1), or -1: the
  // reference then writes every output into the buffer the executor planned for it.
  int output_aliases = -1;
  // Empty: every output gets a buffer of its own. The executor writes an output over an input
  // that dies at the op where this allows it (a loss's gradient over its logits).
  OverwriteRule may_overwrite;
  // False for Prims with no input a gradient could flow to (fill, iota, random, one_hot): they
  // need no VJP rule, since the sweep never reaches them.
  bool differentiable = true;
  // Inputs with no gradient by nature (indices, masks, seeds): the sweep skips them.
  std::vector<int> nondiff_inputs;
  // The input of i32 indices whose range the Prim's kernels check (gather and scatter), or -1:
  // a device index error names that input's shape.
  int index_input = -1;

  // --- user Prims only (id == PrimId::user; core/user_prim.hpp registers them) ----------------
  std::string registered_at;       // "file:line" of the registration, for errors naming it
  PointwiseBodyFn pointwise_body;  // a GPU lowering fused like kiln's own, or empty
  RowBodyFn row_body;              // or one as a fused_rows op, fused like kiln's own
  bool gpu_kernel = false;         // or the GPU lowering is kernels of its own (cuda::register_user_lowering)
  // A composite (kiln::CustomVjp): output 0 is input 0, the composite's forward value; the other
  // inputs are its arguments, which only the VJP rule reads. Every plan forwards input 0.
  bool forwards_input0 = false;
};

// kiln's own Prims, registered when the registry is first used, and the Prims programs register
// at run time (thread-safe; a user Prim stays registered, at a fixed address, until the process ends).
class PrimRegistry {
 public:
  static PrimRegistry& instance();
  const PrimDef& get(PrimId id) const;                 // kiln's own Prims (not PrimId::user)
  const PrimDef& find(const std::string& name) const;  // throws kiln::Error for unknown names
  PrimDef& mutable_find(const std::string& name);      // tests swap rules through this
  // kiln's own in PrimId order, then the user Prims in registration order.
  std::vector<const PrimDef*> all() const;
  // A family registers each of its Prims: `source_file` is the family's __FILE__.
  void add(PrimDef def, const char* source_file);
  // Registers a user Prim (def.id is set to PrimId::user; def.name and def.registered_at given).
  // Throws kiln::Error when the name is taken, naming both registrations.
  const PrimDef& add_user(PrimDef def);

 private:
  PrimRegistry();
  const PrimDef* find_user(const std::string& name) const;
  std::array<std::unique_ptr<PrimDef>, kPrimCount> prims_;
  mutable std::mutex user_mutex_;
  std::deque<std::unique_ptr<PrimDef>> user_;
};

// Replaces a Prim's VJP rule for the guard's lifetime (tests of the gradient checker).
class ScopedVjpOverride {
 public:
  ScopedVjpOverride(const std::string& prim, VjpRule rule);
  ~ScopedVjpOverride();
  ScopedVjpOverride(const ScopedVjpOverride&) = delete;
  ScopedVjpOverride& operator=(const ScopedVjpOverride&) = delete;
  const VjpRule& original() const { return saved_; }

 private:
  PrimDef& def_;
  VjpRule saved_;
};

}  // namespace kiln
