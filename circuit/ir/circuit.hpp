// Circuit: ops in topological order over typed values. External values (inputs bound per
// realization, persistent buffers) have no producer; every other value is an op output.
// A Circuit can be dumped as text, hashed structurally and compared for structural equality,
// which is how a recorded step finds its compiled plan again.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include <kiln/circuit/ir/prim.hpp>

namespace kiln {

enum class ValueRole : uint8_t {
  Computed,    // produced by an op
  Input,       // bound for one realization: a batch, a runtime scalar (lr, step), a realized value
  Persistent,  // outlives steps: a parameter, gradient or optimizer moment; written by assign
};

struct Value {
  ValueInfo info;
  ValueRole role = ValueRole::Computed;
  int32_t producer = -1;  // op index, -1 for externals
  std::string name;       // for dumps: parameter name, "lr", ...
};

// Which part of a training step recorded an op: statistics, the passes that keep phases apart,
// and the recompute pass, which reads it to tell saved values (not part of the structural hash
// or equality: recordings differing only in phases share a plan, correct for both). Recompute marks forward work made
// again in the backward (the recompute pass's copies), which no fusion joins with the forward's own ops. In step order:
// a fused op takes the latest phase among the ops it absorbed.
enum class Phase : uint8_t { Forward = 0, Recompute = 1, Backward = 2, Update = 3 };
inline constexpr size_t kPhaseCount = 4;
// Forward work and its recomputation stay in separate ops: an op made of both would write the
// recomputed value in the forward again, and keep it.
inline bool phases_kept_apart(Phase a, Phase b) {
  return (a == Phase::Forward && b == Phase::Recompute) || (a == Phase::Recompute && b == Phase::Forward);
}

struct Op {
  const PrimDef* prim = nullptr;
  Params params;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::string scope;     // module path of the layer that recorded it
  int32_t absorbed = 0;  // ops a fusion pass merged into this one (dumps only; not structure)
  Phase phase = Phase::Forward;

  bool is(PrimId id) const;
};

// One op in place of several, for Circuit::replace_ops: the ops at `removed` (indices) go, and an
// op of `prim` takes the place of removed op `at`. Its outputs are `kept` (values the removed ops
// produced, of the types its shape rule gives, in order), then new values for the rest.
struct OpReplacement {
  std::vector<int32_t> removed;
  int32_t at = -1;
  const PrimDef* prim = nullptr;
  Params params;
  std::vector<ValueId> inputs;
  std::vector<ValueId> kept;
};

class Circuit {
 public:
  ValueId add_external(ValueInfo info, ValueRole role, std::string name = {});
  // Runs the Prim's shape rule (errors name the op and `scope`) and appends the op.
  std::vector<ValueId> add_op(PrimId prim, Params params, std::vector<ValueId> inputs, const std::string& scope = {});
  // The same by the Prim's name (tests, tools); unknown names are an error.
  std::vector<ValueId> add_op(const std::string& prim, Params params, std::vector<ValueId> inputs,
                              const std::string& scope = {});
  // The same by the PrimDef (passes copying ops of any Prim, a user's included).
  std::vector<ValueId> add_op(const PrimDef& prim, Params params, std::vector<ValueId> inputs,
                              const std::string& scope = {});

  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }
  const ValueInfo& info(ValueId id) const { return value(id).info; }
  size_t num_values() const { return values_.size(); }
  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<ValueId>& externals() const { return externals_; }

  // Rewrites ops in place, every value id staying valid: what a fusion before differentiation
  // does, while Tensor handles hold ids of the recording. The removed ops' other outputs are left
  // with no producer. Refused, changing nothing: an op removed twice, a place not removed, a kept
  // value that no removed op made (or of another type than the op's output), and any op left
  // that reads a value left without a producer. The replacing op takes the phase and scope of the
  // op whose place it takes.
  void replace_ops(const std::vector<OpReplacement>& replacements);

  // Rebuilds the circuit keeping only `keep_ops` (indices, ascending); values are renumbered.
  // `remap` receives old value id -> new id (kNoValue for dropped values).
  Circuit subset(const std::vector<int32_t>& keep_ops, std::vector<ValueId>* remap) const;

  // Records that fusion merged `count` ops into op `op` (shown by dump()).
  void set_absorbed(size_t op, int32_t count) { ops_.at(op).absorbed = count; }
  // The phase add_op gives the ops it appends from now on; and one op's phase (passes).
  void set_recording_phase(Phase p) { recording_phase_ = p; }
  void set_phase(size_t op, Phase p) { ops_.at(op).phase = p; }

  // Rewires every op input v to rename[v] (rename.size() == num_values()); used by CSE. With
  // keep_assign_targets, input 0 of an assign (the buffer version it overwrites) is kept.
  void replace_uses(const std::vector<ValueId>& rename, bool keep_assign_targets = false);

  // Checks invariants: ids valid, topological order, and that every read of a persistent
  // buffer's old contents comes before the assign that overwrites it.
  void verify() const;

  // Structural identity: prims, params, wiring, value types and external roles (names and
  // bound data are not part of it).
  uint64_t structural_hash() const;
  bool structurally_equal(const Circuit& o) const;

  // Readable text, one op a line: "%5 = matmul(%2, %3) ta=0 tb=1 : f32[4, 8]   # h.0.attn".
  std::string dump(const std::string& title = {}) const;

  // Follows a chain of assigns back to the persistent external buffer it writes, or kNoValue.
  ValueId assign_root(ValueId id) const;

 private:
  // A deque: references from value()/info() stay valid while ops are appended (VJP rules
  // hold them across appends).
  std::deque<Value> values_;
  std::vector<Op> ops_;
  std::vector<ValueId> externals_;
  Phase recording_phase_ = Phase::Forward;
};

}  // namespace kiln
