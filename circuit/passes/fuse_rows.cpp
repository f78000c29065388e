// Row-epilogue fusion: reductions along the last axis and the pointwise work over the same rows
// become one fused_rows op (see fusion.hpp for the rules, fused_rows.hpp for the op).
#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

enum class Role { None, Reduce, Elementwise };

// Is op a row-fusion candidate, and over what: for a reduction, the domain it reduces; for an
// elementwise op, its output shape (the domain or the domain's per-row shape).
Role role_of(const Circuit& c, const Op& op, Shape* shape) {
  const PrimId p = op.prim->id;
  if (op.outputs.size() != 1) return Role::None;
  const ValueInfo& out = c.info(op.outputs[0]);
  if (out.dtype != DType::f32 && out.dtype != DType::f64) return Role::None;
  if (p == PrimId::reduce) {
    const Shape& x = c.info(op.inputs[0]).shape;
    if (ReduceParams::of(op).axis != x.rank() - 1 || x[x.rank() - 1] < 2) return Role::None;
    *shape = x;
    return Role::Reduce;
  }
  if (p == PrimId::pointwise || p == PrimId::where || p == PrimId::broadcast || p == PrimId::stop_gradient) {
    *shape = out.shape;
    return Role::Elementwise;
  }
  return Role::None;
}

class RowFuser {
 public:
  RowFuser(const Circuit& c, const std::vector<ValueId>& outputs) : c_(c), ops_(c.ops()) {
    const size_t n = ops_.size();
    succ_ = op_successors(c);
    role_.resize(n, Role::None);
    shape_.resize(n);
    group_.assign(n, -1);
    protected_.assign(c.num_values(), false);
    for (ValueId o : outputs) protected_[static_cast<size_t>(o)] = true;
    consumers_.resize(c.num_values());
    matmuls_before_ = matmuls_before_each_op(c);
    for (size_t i = 0; i < n; ++i) {
      role_[i] = role_of(c, ops_[i], &shape_[i]);
      for (ValueId in : ops_[i].inputs) consumers_[static_cast<size_t>(in)].push_back(static_cast<int32_t>(i));
    }
  }

  void form_groups() {
    // Row groups first (seeded by reductions), then element groups (seeded by values that
    // two ops of their shape read); both grow to a fixpoint.
    for (size_t i = 0; i < ops_.size(); ++i)
      if (role_[i] == Role::Reduce) seed(static_cast<int32_t>(i), true);
    grow();
    for (size_t i = 0; i < ops_.size(); ++i)
      if (role_[i] == Role::Elementwise && group_[i] < 0 && shared_read(static_cast<int32_t>(i)))
        seed(static_cast<int32_t>(i), false);
    grow();
  }

  Circuit rebuild(std::vector<ValueId>& outputs);

 private:
  struct Group {
    std::vector<int32_t> members;  // op indices, ascending
    Shape domain;
    bool reduces = false;  // has a reduction: per-row members may join
  };

  void seed(int32_t op, bool reduces) {
    const Shape& d = shape_[static_cast<size_t>(op)];
    if (d.rank() < 1 || d.numel() == 0) return;
    group_[static_cast<size_t>(op)] = static_cast<int32_t>(groups_.size());
    groups_.push_back({{op}, d, reduces});
  }

  // Does op's result, or a value of its shape it reads, have another element-op reader of
  // that shape (a sibling sharing data)?
  bool shared_read(int32_t op) const {
    const Op& o = ops_[static_cast<size_t>(op)];
    const Shape& d = shape_[static_cast<size_t>(op)];
    std::vector<ValueId> vals = o.inputs;
    vals.push_back(o.outputs[0]);
    for (ValueId v : vals) {
      if (c_.info(v).shape != d) continue;
      for (int32_t q : consumers_[static_cast<size_t>(v)])
        if (q != op && role_[static_cast<size_t>(q)] == Role::Elementwise && shape_[static_cast<size_t>(q)] == d)
          return true;
    }
    return false;
  }

  void grow() {
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t g = 0; g < groups_.size(); ++g) {
        if (groups_[g].members.empty()) continue;
        // Neighbours in op order, so that growth is deterministic: producers, consumers, and
        // siblings reading a value of the domain's shape.
        std::set<int32_t> near;
        for (int32_t m : groups_[g].members) {
          for (ValueId in : ops_[static_cast<size_t>(m)].inputs) {
            if (int32_t p = c_.value(in).producer; p >= 0) near.insert(p);
            if (c_.info(in).shape == groups_[g].domain)
              for (int32_t q : consumers_[static_cast<size_t>(in)]) near.insert(q);
          }
          for (ValueId out : ops_[static_cast<size_t>(m)].outputs)
            for (int32_t q : consumers_[static_cast<size_t>(out)]) near.insert(q);
        }
        for (int32_t k : near) {
          if (group_[static_cast<size_t>(k)] == static_cast<int32_t>(g) || !fits(k, groups_[g])) continue;
          if (try_join(static_cast<int32_t>(g), k)) changed = true;
        }
      }
    }
  }

  bool fits(int32_t op, const Group& g) const {
    const auto i = static_cast<size_t>(op);
    // The optimizer's work stays apart from the step's, so that the multi-tensor merge can
    // make the update of every parameter one launch.
    auto updates = [&](int32_t k) { return ops_[static_cast<size_t>(k)].phase == Phase::Update; };
    if (updates(op) != updates(g.members.front())) return false;
    if (role_[i] == Role::Reduce) return shape_[i] == g.domain;
    if (role_[i] != Role::Elementwise) return false;
    Shape row = g.domain;
    row[row.rank() - 1] = 1;
    // A per-row member needs a reduction in the group (an element group has none to wait for).
    const int32_t h = group_[i];
    const bool reduces = g.reduces || (h >= 0 && groups_[static_cast<size_t>(h)].reduces);
    return shape_[i] == g.domain || (reduces && shape_[i] == row);
  }

  // Joins op k (or the whole group it is in) into group g unless that would make the graph of
  // groups cyclic: no path may leave the union and come back to it, also through other groups.
  bool try_join(int32_t g, int32_t k) {
    const int32_t h = group_[static_cast<size_t>(k)];
    if (h >= 0 && groups_[static_cast<size_t>(h)].domain != groups_[static_cast<size_t>(g)].domain) return false;
    std::vector<int32_t> uni = groups_[static_cast<size_t>(g)].members;
    if (h >= 0)
      uni.insert(uni.end(), groups_[static_cast<size_t>(h)].members.begin(),
                 groups_[static_cast<size_t>(h)].members.end());
    else
      uni.push_back(k);
    std::sort(uni.begin(), uni.end());
    bool forward = false, recompute = false;
    for (int32_t m : uni) {
      forward = forward || ops_[static_cast<size_t>(m)].phase == Phase::Forward;
      recompute = recompute || ops_[static_cast<size_t>(m)].phase == Phase::Recompute;
    }
    if (forward && recompute) return false;  // phases_kept_apart
    // The group runs where its last member was: members before a product would keep what they
    // read live across it. Refused where a member makes a large value (kLargeValueBytes).
    size_t largest = 0;
    for (int32_t m : uni)
      for (ValueId o : ops_[static_cast<size_t>(m)].outputs) largest = std::max(largest, c_.info(o).nbytes());
    if (largest >= kLargeValueBytes &&
        matmuls_before_[static_cast<size_t>(uni.back())] > matmuls_before_[static_cast<size_t>(uni.front()) + 1])
      return false;
    if (leaves_and_returns(uni, g, h)) return false;
    for (int32_t m : uni) group_[static_cast<size_t>(m)] = g;
    Group& into = groups_[static_cast<size_t>(g)];
    into.members = uni;
    into.reduces = into.reduces || role_[static_cast<size_t>(k)] == Role::Reduce ||
                   (h >= 0 && groups_[static_cast<size_t>(h)].reduces);
    if (h >= 0) groups_[static_cast<size_t>(h)].members.clear();
    return true;
  }

  bool leaves_and_returns(const std::vector<int32_t>& uni, int32_t g, int32_t h) const {
    auto inside = [&](int32_t op) {
      const int32_t og = group_[static_cast<size_t>(op)];
      return (og >= 0 && (og == g || og == h)) || std::binary_search(uni.begin(), uni.end(), op);
    };
    std::vector<char> seen(ops_.size(), 0);
    std::vector<int32_t> stack;
    auto visit = [&](int32_t op) {
      if (seen[static_cast<size_t>(op)]) return;
      seen[static_cast<size_t>(op)] = 1;
      stack.push_back(op);
      // A reached member of another group stands for its whole group.
      if (int32_t og = group_[static_cast<size_t>(op)]; og >= 0)
        for (int32_t m : groups_[static_cast<size_t>(og)].members)
          if (!seen[static_cast<size_t>(m)]) {
            seen[static_cast<size_t>(m)] = 1;
            stack.push_back(m);
          }
    };
    for (int32_t m : uni)
      for (int32_t s : succ_[static_cast<size_t>(m)])
        if (!inside(s)) visit(s);
    while (!stack.empty()) {
      const int32_t op = stack.back();
      stack.pop_back();
      for (int32_t s : succ_[static_cast<size_t>(op)]) {
        if (inside(s)) return true;
        visit(s);
      }
    }
    return false;
  }

  // The fused op of group g: its inputs (ids of c_) and params; `outs` receives the member
  // values it writes, in order.
  Params program_of(const Group& g, std::vector<ValueId>& inputs, std::vector<ValueId>& outs) const;

  const Circuit& c_;
  const std::vector<Op>& ops_;
  std::vector<std::vector<int32_t>> succ_;       // data and buffer-order edges, by op
  std::vector<std::vector<int32_t>> consumers_;  // by value
  std::vector<int32_t> matmuls_before_;          // by op: the matmuls (fused or not) before it
  std::vector<Role> role_;
  std::vector<Shape> shape_;
  std::vector<int32_t> group_;
  std::vector<Group> groups_;
  std::vector<bool> protected_;
};

Params RowFuser::program_of(const Group& g, std::vector<ValueId>& inputs, std::vector<ValueId>& outs) const {
  std::set<int32_t> members(g.members.begin(), g.members.end());
  auto is_member_value = [&](ValueId v) { return members.count(c_.value(v).producer) > 0; };
  for (int32_t m : g.members)
    for (ValueId in : ops_[static_cast<size_t>(m)].inputs)
      if (!is_member_value(in) && !FillParams::float_value(c_, in) &&
          std::find(inputs.begin(), inputs.end(), in) == inputs.end())
        inputs.push_back(in);
  RowProgram rp;
  rp.inputs = static_cast<int>(inputs.size());
  rp.domain = g.domain;
  std::map<ValueId, ScalarExp> e;
  auto expr = [&](ValueId v) -> ScalarExp {
    if (auto it = e.find(v); it != e.end()) return it->second;
    if (const std::optional<double> value = FillParams::float_value(c_, v)) return se::c(*value);
    auto at = std::find(inputs.begin(), inputs.end(), v);
    return se::in(static_cast<int>(at - inputs.begin()));
  };
  for (int32_t m : g.members) {
    const Op& op = ops_[static_cast<size_t>(m)];
    std::vector<ScalarExp> args;
    for (ValueId in : op.inputs) args.push_back(expr(in));
    const PrimId p = op.prim->id;
    ScalarExp out;
    if (p == PrimId::pointwise) {
      out = op.params.body.substitute(args);
    } else if (p == PrimId::where) {
      out = se::select(args[0], args[1], args[2]);
    } else if (p == PrimId::reduce) {
      rp.reduction_kinds.push_back(ReduceParams::of(op).kind);
      rp.reduction_bodies.push_back(args[0]);
      out = se::in(rp.inputs + static_cast<int>(rp.reduction_bodies.size()) - 1);
    } else {  // broadcast, stop_gradient: the value itself, read with broadcasting
      out = args[0];
    }
    const ValueId v = op.outputs[0];
    e[v] = out;
    bool used_outside = protected_[static_cast<size_t>(v)];
    for (int32_t q : consumers_[static_cast<size_t>(v)]) used_outside = used_outside || !members.count(q);
    if (used_outside) {
      outs.push_back(v);
      rp.output_per_row.push_back(c_.info(v).shape != g.domain);
      rp.output_bodies.push_back(out);
    }
  }
  return rp.to_params(outs.empty() ? DType::f32 : c_.info(outs.front()).dtype);
}

Circuit RowFuser::rebuild(std::vector<ValueId>& outputs) {
  // A group of one keeps its op.
  std::vector<const Group*> fused;
  std::vector<std::vector<int32_t>> members;
  for (const Group& g : groups_)
    if (g.members.size() > 1) {
      fused.push_back(&g);
      members.push_back(g.members);
    }
  auto merge = [&](size_t k) {
    MergedOp m{PrimId::fused_rows, {}, {}, {}};
    m.params = program_of(*fused[k], m.inputs, m.replaces);
    return m;
  };
  return contract_groups(c_, members, merge, outputs, "fuse_rows");
}

}  // namespace

Circuit fuse_rows(const Circuit& c, std::vector<ValueId>& outputs) {
  RowFuser f(c, outputs);
  f.form_groups();
  // Float fills the groups read as constants are dead now: dropped, not launched.
  Circuit fused = f.rebuild(outputs);
  return dce(fused, outputs);
}

}  // namespace kiln
