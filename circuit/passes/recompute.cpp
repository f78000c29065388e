// The recomputation pass (see recompute.hpp): one topological sweep decides what can be made
// again in the backward, a second emits the copies where the backward first needs them.
#include <algorithm>
#include <cctype>
#include <limits>
#include <map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/recompute.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

const char* recompute_mode_name(RecomputeMode m) {
  switch (m) {
    case RecomputeMode::none: return "none";
    case RecomputeMode::automatic: return "auto";
    case RecomputeMode::blocks: return "blocks";
  }
  return "?";
}

RecomputeMode parse_recompute_mode(std::string_view text) {
  for (RecomputeMode m : {RecomputeMode::none, RecomputeMode::automatic, RecomputeMode::blocks})
    if (text == recompute_mode_name(m)) return m;
  throw Error("--recompute: expected none, auto or blocks, received '" + std::string(text) + "'");
}

std::string block_of_scope(const std::string& scope) {
  size_t start = 0;
  while (start < scope.size()) {
    size_t end = scope.find('.', start);
    if (end == std::string::npos) end = scope.size();
    const bool numeric = end > start && std::all_of(scope.begin() + static_cast<std::ptrdiff_t>(start),
                                                    scope.begin() + static_cast<std::ptrdiff_t>(end), [](char ch) {
                                                      return std::isdigit(static_cast<unsigned char>(ch));
                                                    });
    if (numeric) return scope.substr(0, end);
    start = end + 1;
  }
  return {};
}

namespace {

constexpr int32_t kNever = std::numeric_limits<int32_t>::max();

// Work that costs no matmul, attention or reduction: what `automatic` makes again.
bool cheap(const Op& op) {
  switch (op.prim->id) {
    case PrimId::pointwise:
    case PrimId::where:
    case PrimId::broadcast:
    case PrimId::reshape:
    case PrimId::permute:
    case PrimId::slice:
    case PrimId::split:
    case PrimId::concat:
    case PrimId::cast:
    case PrimId::stop_gradient:
    case PrimId::fill:
    case PrimId::iota:
    case PrimId::random: return true;
    default: return false;
  }
}

// Work a checkpointed block may do again: any but side effects, collectives and user Prims
// (whose references need not give the same values twice).
bool repeatable(const Op& op) { return !op.prim->side_effect && !is_collective(op) && !op.is(PrimId::user); }

// Per op, the block it is in (an index in order of first appearance among forward ops), or -1.
std::vector<int> blocks_of_ops(const Circuit& c, int* count) {
  std::map<std::string, int> ids;
  std::vector<int> block(c.ops().size(), -1);
  for (size_t i = 0; i < c.ops().size(); ++i) {
    if (c.ops()[i].phase != Phase::Forward) continue;
    const std::string b = block_of_scope(c.ops()[i].scope);
    if (b.empty()) continue;
    block[i] = ids.emplace(b, static_cast<int>(ids.size())).first->second;
  }
  if (count) *count = static_cast<int>(ids.size());
  return block;
}

class Recomputer {
 public:
  Recomputer(const Circuit& c, const std::vector<ValueId>& outputs, RecomputeMode mode, int checkpointed_blocks)
      : c_(c), ops_(c.ops()), mode_(mode), checkpointed_(checkpointed_blocks) {
    const size_t nv = c.num_values(), n = ops_.size();
    first_reader_.assign(nv, kNever);
    assigned_at_.assign(nv, kNever);
    requested_.assign(nv, false);
    for (ValueId o : outputs) requested_[static_cast<size_t>(o)] = true;
    for (size_t i = 0; i < n; ++i) {
      const Op& op = ops_[i];
      if (op.prim->side_effect) {
        int32_t& a = assigned_at_[static_cast<size_t>(op.inputs[0])];
        a = std::min(a, static_cast<int32_t>(i));
      }
      if (op.phase == Phase::Forward) continue;
      for (ValueId in : op.inputs)
        if (forward_value(in)) {
          int32_t& r = first_reader_[static_cast<size_t>(in)];
          r = std::min(r, static_cast<int32_t>(i));
        }
    }
    block_ = blocks_of_ops(c, nullptr);
    // A checkpointed block's outputs (what forward ops outside it read: the residual stream) are
    // the next block's input, kept: a copy of them would make each block's copies read the
    // previous block's, all recomputed at the start of the backward.
    block_output_.assign(nv, false);
    for (size_t i = 0; i < n; ++i) {
      if (ops_[i].phase != Phase::Forward) continue;
      for (ValueId in : ops_[i].inputs) {
        const int32_t q = c.value(in).producer;
        if (q >= 0 && checkpointed(block_[static_cast<size_t>(q)]) && block_[static_cast<size_t>(q)] != block_[i])
          block_output_[static_cast<size_t>(in)] = true;
      }
    }
    resolvable_.assign(n, false);
    deadline_.assign(n, kNever);
    uses_copy_.resize(n);
    redirected_.assign(nv, false);
  }

  // Which forward ops can be made again and which saved values the backward reads again.
  void decide() {
    for (size_t p = 0; p < ops_.size(); ++p) {
      const Op& op = ops_[p];
      if (op.phase != Phase::Forward || op.prim->side_effect || op.outputs.empty()) continue;
      const bool in_block = checkpointed(block_[p]);
      if (in_block ? !repeatable(op) : !cheap(op)) continue;
      // Another block's work (or, outside checkpointed blocks, a checkpointed block's) is read
      // as it is, never through a copy.
      auto crosses = [&](int32_t q) {
        return in_block ? block_[static_cast<size_t>(q)] != block_[p] : checkpointed(block_[static_cast<size_t>(q)]);
      };
      bool ok = true;
      int32_t deadline = kNever;
      std::vector<char> copy(op.inputs.size(), 0);
      for (size_t k = 0; k < op.inputs.size() && ok; ++k) {
        const ValueId x = op.inputs[k];
        const int32_t q = c_.value(x).producer;
        deadline = std::min(deadline, assigned_at_[static_cast<size_t>(x)]);  // a buffer version read
        if (q < 0) {
          // An external: read as it is.
        } else if (redirected_[static_cast<size_t>(x)]) {
          copy[k] = 1;  // the original dies in the forward: read its copy (never another block's)
        } else if (saved(x)) {
          // Kept for the backward anyway: read as it is.
        } else if (ops_[static_cast<size_t>(q)].phase != Phase::Forward) {
          ok = false;
        } else if (resolvable_[static_cast<size_t>(q)] && !crosses(q)) {
          copy[k] = 1;
        } else {
          // A block reads what other blocks (or no block) made as its input, kept from then on;
          // cheap work outside a block may not keep anything longer than it lived.
          ok = in_block && crosses(q);
        }
        if (copy[k]) deadline = std::min(deadline, deadline_[static_cast<size_t>(q)]);
      }
      if (!ok) continue;
      // A cast of a value kept anyway (attention's output to bf16) would save only the narrower
      // copy's bytes for a pass over the wider value: kept.
      if (!in_block && op.is(PrimId::cast) && std::none_of(copy.begin(), copy.end(), [](char k) { return k; }))
        continue;
      resolvable_[p] = true;
      deadline_[p] = deadline;
      uses_copy_[p] = std::move(copy);
      for (ValueId v : op.outputs)
        redirected_[static_cast<size_t>(v)] = saved(v) && !requested_[static_cast<size_t>(v)] &&
                                              !block_output_[static_cast<size_t>(v)] &&
                                              deadline > first_reader_[static_cast<size_t>(v)];
    }
  }

  Circuit rebuild(std::vector<ValueId>& outputs) {
    const size_t n = ops_.size();
    // The copies: producers of the values redirected, and what they read through copies; each
    // placed before the first backward op that needs it (directly or through another copy).
    std::vector<int32_t> need(n, kNever);
    for (size_t p = 0; p < n; ++p)
      for (ValueId v : ops_[p].outputs)
        if (redirected_[static_cast<size_t>(v)]) need[p] = std::min(need[p], first_reader_[static_cast<size_t>(v)]);
    for (size_t p = n; p-- > 0;) {
      if (need[p] == kNever) continue;
      for (size_t k = 0; k < ops_[p].inputs.size(); ++k)
        if (uses_copy_[p][k]) {
          const auto q = static_cast<size_t>(c_.value(ops_[p].inputs[k]).producer);
          need[q] = std::min(need[q], need[p]);
        }
    }
    std::vector<std::vector<int32_t>> before(n);
    for (size_t p = 0; p < n; ++p)
      if (need[p] != kNever) before[static_cast<size_t>(need[p])].push_back(static_cast<int32_t>(p));

    Rebuild r(c_);
    std::vector<ValueId> copy_of(c_.num_values(), kNoValue);
    for (size_t i = 0; i < n; ++i) {
      for (int32_t p : before[i]) {
        const Op& op = ops_[static_cast<size_t>(p)];
        std::vector<ValueId> inputs;
        for (size_t k = 0; k < op.inputs.size(); ++k)
          inputs.push_back(uses_copy_[static_cast<size_t>(p)][k] ? copy_of[static_cast<size_t>(op.inputs[k])]
                                                                 : r.at(op.inputs[k]));
        const std::vector<ValueId> outs = r.emit(op, op.params, inputs);
        r.out().set_phase(r.out().ops().size() - 1, Phase::Recompute);
        for (size_t k = 0; k < outs.size(); ++k) copy_of[static_cast<size_t>(op.outputs[k])] = outs[k];
      }
      const Op& op = ops_[i];
      if (op.phase == Phase::Forward) {
        r.copy(op);
        continue;
      }
      std::vector<ValueId> inputs;
      for (ValueId in : op.inputs)
        inputs.push_back(redirected_[static_cast<size_t>(in)] ? copy_of[static_cast<size_t>(in)] : r.at(in));
      const std::vector<ValueId> outs = r.emit(op, op.params, inputs);
      for (size_t k = 0; k < outs.size(); ++k) r.map(op.outputs[k], outs[k]);
    }
    return r.finish(outputs);
  }

  bool any_redirected() const { return std::find(redirected_.begin(), redirected_.end(), true) != redirected_.end(); }

 private:
  bool forward_value(ValueId v) const {
    const int32_t p = c_.value(v).producer;
    return p >= 0 && ops_[static_cast<size_t>(p)].phase == Phase::Forward;
  }
  bool saved(ValueId v) const { return first_reader_[static_cast<size_t>(v)] != kNever; }
  bool checkpointed(int block) const {
    return mode_ == RecomputeMode::blocks && block >= 0 && (checkpointed_ < 0 || block < checkpointed_);
  }

  const Circuit& c_;
  const std::vector<Op>& ops_;
  RecomputeMode mode_;
  int checkpointed_;
  std::vector<int32_t> first_reader_;  // per value: the first non-forward op reading it (saved values)
  std::vector<int32_t> assigned_at_;   // per buffer version: the first assign overwriting it
  std::vector<bool> requested_;
  std::vector<int> block_;                    // per op
  std::vector<bool> block_output_;            // per value: a checkpointed block's, read outside it
  std::vector<bool> resolvable_;              // per op: can be made again in the backward
  std::vector<int32_t> deadline_;             // per resolvable op: the first overwrite of a buffer its copy reads
  std::vector<std::vector<char>> uses_copy_;  // per resolvable op and input: read through a copy
  std::vector<bool> redirected_;              // per value: the backward reads its copy
};

}  // namespace

int count_blocks(const Circuit& c) {
  int count = 0;
  blocks_of_ops(c, &count);
  return count;
}

Circuit recompute(const Circuit& c, std::vector<ValueId>& outputs, RecomputeMode mode, int checkpointed_blocks) {
  if (mode == RecomputeMode::none) return c;
  Recomputer rc(c, outputs, mode, checkpointed_blocks);
  rc.decide();
  if (!rc.any_redirected()) return c;
  return rc.rebuild(outputs);
}

}  // namespace kiln
