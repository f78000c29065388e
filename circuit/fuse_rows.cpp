// Row-epilogue fusion: reductions along the last axis and the pointwise work over the same rows
// become one fused_rows op (see fusion.hpp for the rules, fused_rows.hpp for the op).
#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <set>

#include "circuit/error.hpp"
#include "circuit/fused_rows.hpp"
#include "circuit/fusion.hpp"

namespace kiln {
namespace {

enum class Role { None, Reduce, Elementwise };

// Is op a row-fusion candidate, and over what: for a reduction, the domain it reduces; for an
// elementwise op, its output shape (the domain or the domain's per-row shape).
Role role_of(const Circuit& c, const Op& op, Shape* shape) {
  const std::string& p = op.prim->name;
  if (op.outputs.size() != 1) return Role::None;
  const ValueInfo& out = c.info(op.outputs[0]);
  if (out.dtype != DType::f32 && out.dtype != DType::f64) return Role::None;
  if (p == "reduce") {
    const Shape& x = c.info(op.inputs[0]).shape;
    if (op.params.ints[1] != x.rank() - 1 || x[x.rank() - 1] < 2) return Role::None;
    *shape = x;
    return Role::Reduce;
  }
  if (p == "pointwise" || p == "where" || p == "broadcast" || p == "stop_gradient") {
    *shape = out.shape;
    return Role::Elementwise;
  }
  return Role::None;
}

bool is_float_fill(const Circuit& c, ValueId v) {
  const int32_t p = c.value(v).producer;
  if (p < 0) return false;
  const Op& op = c.ops()[static_cast<size_t>(p)];
  return op.prim->name == "fill" && (op.params.dtype == DType::f32 || op.params.dtype == DType::f64);
}

class RowFuser {
 public:
  RowFuser(const Circuit& c, const std::vector<ValueId>& outputs) : c_(c), ops_(c.ops()) {
    const size_t n = ops_.size();
    succ_.resize(n);
    role_.resize(n, Role::None);
    shape_.resize(n);
    group_.assign(n, -1);
    protected_.assign(c.num_values(), false);
    for (ValueId o : outputs) protected_[static_cast<size_t>(o)] = true;
    consumers_.resize(c.num_values());
    for (size_t i = 0; i < n; ++i) {
      role_[i] = role_of(c, ops_[i], &shape_[i]);
      for (ValueId in : ops_[i].inputs) {
        consumers_[static_cast<size_t>(in)].push_back(static_cast<int32_t>(i));
        const int32_t p = c.value(in).producer;
        if (p >= 0) succ_[static_cast<size_t>(p)].push_back(static_cast<int32_t>(i));
      }
    }
    // A read of a buffer's old contents must stay before the assign that overwrites it.
    for (size_t i = 0; i < n; ++i)
      if (ops_[i].prim->side_effect)
        for (int32_t reader : consumers_[static_cast<size_t>(ops_[i].inputs[0])])
          if (reader != static_cast<int32_t>(i)) succ_[static_cast<size_t>(reader)].push_back(static_cast<int32_t>(i));
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
      if (!is_member_value(in) && !is_float_fill(c_, in) && std::find(inputs.begin(), inputs.end(), in) == inputs.end())
        inputs.push_back(in);
  RowProgram rp;
  rp.inputs = static_cast<int>(inputs.size());
  rp.domain = g.domain;
  std::map<ValueId, ScalarExp> e;
  auto expr = [&](ValueId v) -> ScalarExp {
    if (auto it = e.find(v); it != e.end()) return it->second;
    if (is_float_fill(c_, v)) return se::c(ops_[static_cast<size_t>(c_.value(v).producer)].params.reals[0]);
    auto at = std::find(inputs.begin(), inputs.end(), v);
    return se::in(static_cast<int>(at - inputs.begin()));
  };
  for (int32_t m : g.members) {
    const Op& op = ops_[static_cast<size_t>(m)];
    std::vector<ScalarExp> args;
    for (ValueId in : op.inputs) args.push_back(expr(in));
    const std::string& p = op.prim->name;
    ScalarExp out;
    if (p == "pointwise") {
      out = op.params.body.substitute(args);
    } else if (p == "where") {
      out = se::select(args[0], args[1], args[2]);
    } else if (p == "reduce") {
      rp.reduction_kinds.push_back(static_cast<ReduceKind>(op.params.ints[0]));
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
  // Nodes: every op outside a fused group, and each group with more than one member (a group
  // of one keeps its op). Emitted in a topological order of the node graph, earliest first.
  const size_t n = ops_.size();
  std::vector<int32_t> node(n);
  std::vector<std::vector<int32_t>> node_ops;
  for (size_t i = 0; i < n; ++i) {
    const int32_t g = group_[i];
    if (g >= 0 && groups_[static_cast<size_t>(g)].members.size() > 1) {
      if (groups_[static_cast<size_t>(g)].members.front() == static_cast<int32_t>(i)) {
        for (int32_t m : groups_[static_cast<size_t>(g)].members)
          node[static_cast<size_t>(m)] = static_cast<int32_t>(node_ops.size());
        node_ops.push_back(groups_[static_cast<size_t>(g)].members);
      }
    } else {
      node[i] = static_cast<int32_t>(node_ops.size());
      node_ops.push_back({static_cast<int32_t>(i)});
    }
  }
  std::vector<std::set<int32_t>> node_succ(node_ops.size());
  std::vector<int32_t> indegree(node_ops.size(), 0);
  for (size_t i = 0; i < n; ++i)
    for (int32_t s : succ_[i])
      if (node[i] != node[static_cast<size_t>(s)] &&
          node_succ[static_cast<size_t>(node[i])].insert(node[static_cast<size_t>(s)]).second)
        ++indegree[static_cast<size_t>(node[static_cast<size_t>(s)])];
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> ready;  // node ids follow op order
  for (size_t k = 0; k < node_ops.size(); ++k)
    if (indegree[k] == 0) ready.push(static_cast<int32_t>(k));

  Circuit out;
  std::vector<ValueId> remap(c_.num_values(), kNoValue);
  for (ValueId x : c_.externals()) {
    const Value& v = c_.value(x);
    remap[static_cast<size_t>(x)] = out.add_external(v.info, v.role, v.name);
  }
  auto mapped = [&](const std::vector<ValueId>& ids) {
    std::vector<ValueId> r;
    for (ValueId v : ids) r.push_back(remap[static_cast<size_t>(v)]);
    return r;
  };
  size_t emitted = 0;
  while (!ready.empty()) {
    const int32_t k = ready.top();
    ready.pop();
    ++emitted;
    const std::vector<int32_t>& members = node_ops[static_cast<size_t>(k)];
    if (members.size() == 1) {
      const Op& op = ops_[static_cast<size_t>(members[0])];
      std::vector<ValueId> outs = out.add_op(op.prim->name, op.params, mapped(op.inputs), op.scope);
      out.set_absorbed(out.ops().size() - 1, op.absorbed);
      out.set_phase(out.ops().size() - 1, op.phase);
      for (size_t j = 0; j < outs.size(); ++j) remap[static_cast<size_t>(op.outputs[j])] = outs[j];
    } else {
      const Group& g = groups_[static_cast<size_t>(group_[static_cast<size_t>(members[0])])];
      std::vector<ValueId> inputs, written;
      Params params = program_of(g, inputs, written);
      if (!written.empty()) {  // else nothing reads the group: dead code, dropped
        int32_t absorbed = static_cast<int32_t>(members.size()) - 1;
        std::string scope;
        Phase phase = Phase::Forward;
        for (int32_t m : members) {
          absorbed += ops_[static_cast<size_t>(m)].absorbed;
          phase = std::max(phase, ops_[static_cast<size_t>(m)].phase);
          if (scope.empty()) scope = ops_[static_cast<size_t>(m)].scope;
        }
        std::vector<ValueId> outs = out.add_op("fused_rows", std::move(params), mapped(inputs), scope);
        out.set_absorbed(out.ops().size() - 1, absorbed);
        out.set_phase(out.ops().size() - 1, phase);
        for (size_t j = 0; j < outs.size(); ++j) remap[static_cast<size_t>(written[j])] = outs[j];
      }
    }
    for (int32_t s : node_succ[static_cast<size_t>(k)])
      if (--indegree[static_cast<size_t>(s)] == 0) ready.push(s);
  }
  if (emitted != node_ops.size()) throw Error("fuse_rows: internal error, the fused graph has a cycle");
  for (ValueId& o : outputs) o = remap[static_cast<size_t>(o)];
  out.verify();
  return out;
}

}  // namespace

Circuit fuse_rows(const Circuit& c, std::vector<ValueId>& outputs) {
  RowFuser f(c, outputs);
  f.form_groups();
  return f.rebuild(outputs);
}

}  // namespace kiln
