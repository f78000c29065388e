// Contraction of op groups into single ops, with a topological re-ordering (Kahn's algorithm).
#include <algorithm>
#include <queue>
#include <set>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/contract.hpp>

namespace kiln {

std::vector<std::vector<int32_t>> value_readers(const Circuit& c) {
  std::vector<std::vector<int32_t>> readers(c.num_values());
  for (size_t i = 0; i < c.ops().size(); ++i)
    for (ValueId in : c.ops()[i].inputs) readers[static_cast<size_t>(in)].push_back(static_cast<int32_t>(i));
  return readers;
}

std::vector<std::vector<int32_t>> op_successors(const Circuit& c) {
  const auto& ops = c.ops();
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<std::vector<int32_t>> succ(ops.size());
  for (size_t i = 0; i < ops.size(); ++i)
    for (ValueId in : ops[i].inputs) {
      const int32_t p = c.value(in).producer;
      if (p >= 0) succ[static_cast<size_t>(p)].push_back(static_cast<int32_t>(i));
    }
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].prim->side_effect)
      for (int32_t reader : readers[static_cast<size_t>(ops[i].inputs[0])])
        if (reader != static_cast<int32_t>(i)) succ[static_cast<size_t>(reader)].push_back(static_cast<int32_t>(i));
  return succ;
}

Rebuild::Rebuild(const Circuit& from) : remap_(from.num_values(), kNoValue) {
  for (ValueId x : from.externals()) {
    const Value& v = from.value(x);
    map(x, out_.add_external(v.info, v.role, v.name));
  }
}

std::vector<ValueId> Rebuild::at(const std::vector<ValueId>& ids) const {
  std::vector<ValueId> r;
  for (ValueId v : ids) r.push_back(at(v));
  return r;
}

void Rebuild::copy(const Op& op, const Params* params) {
  const std::vector<ValueId> outs = emit(op, params ? *params : op.params, at(op.inputs));
  for (size_t k = 0; k < outs.size(); ++k) map(op.outputs[k], outs[k]);
}

std::vector<ValueId> Rebuild::emit(const Op& like, const Params& params, const std::vector<ValueId>& inputs) {
  std::vector<ValueId> outs = out_.add_op(*like.prim, params, inputs, like.scope);
  out_.set_absorbed(out_.ops().size() - 1, like.absorbed);
  out_.set_phase(out_.ops().size() - 1, like.phase);
  return outs;
}

std::vector<std::vector<int32_t>> producer_groups(const std::map<int32_t, std::vector<int32_t>>& joining) {
  std::vector<std::vector<int32_t>> groups;
  for (const auto& [producer, members] : joining) {
    std::vector<int32_t> group{producer};
    group.insert(group.end(), members.begin(), members.end());
    groups.push_back(std::move(group));
  }
  return groups;
}

Circuit Rebuild::finish(std::vector<ValueId>& outputs) {
  for (ValueId& o : outputs) o = at(o);
  out_.verify();
  return std::move(out_);
}

bool leaves_and_returns(const std::vector<std::vector<int32_t>>& succ, const std::vector<int32_t>& group) {
  if (group.empty()) return false;
  const int32_t last = *std::max_element(group.begin(), group.end());  // no path back starts past it
  auto in_group = [&](int32_t o) { return std::find(group.begin(), group.end(), o) != group.end(); };
  std::vector<bool> seen(succ.size(), false);
  std::vector<int32_t> stack;
  for (int32_t m : group)
    for (int32_t s : succ[static_cast<size_t>(m)])
      if (!in_group(s) && s < last && !seen[static_cast<size_t>(s)]) {
        seen[static_cast<size_t>(s)] = true;
        stack.push_back(s);
      }
  while (!stack.empty()) {
    const int32_t o = stack.back();
    stack.pop_back();
    for (int32_t s : succ[static_cast<size_t>(o)]) {
      if (in_group(s)) return true;
      if (s < last && !seen[static_cast<size_t>(s)]) {
        seen[static_cast<size_t>(s)] = true;
        stack.push_back(s);
      }
    }
  }
  return false;
}

Circuit contract_groups(const Circuit& c, const std::vector<std::vector<int32_t>>& groups,
                        const std::function<MergedOp(size_t group)>& merge, std::vector<ValueId>& outputs,
                        const std::string& pass) {
  // Nodes: every op outside the groups, and each group; node ids follow the first op of each.
  const auto& ops = c.ops();
  const size_t n = ops.size();
  std::vector<int32_t> group_of(n, -1);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int32_t m : groups[g]) group_of[static_cast<size_t>(m)] = static_cast<int32_t>(g);
  std::vector<int32_t> node(n);
  std::vector<int32_t> node_group;  // per node: its group, or -1 for a single op
  std::vector<int32_t> node_op;     // per single-op node: the op
  for (size_t i = 0; i < n; ++i) {
    const int32_t g = group_of[i];
    if (g >= 0 && groups[static_cast<size_t>(g)].front() != static_cast<int32_t>(i)) continue;
    const auto k = static_cast<int32_t>(node_group.size());
    node_group.push_back(g);
    node_op.push_back(static_cast<int32_t>(i));
    if (g < 0) {
      node[i] = k;
    } else {
      for (int32_t m : groups[static_cast<size_t>(g)]) node[static_cast<size_t>(m)] = k;
    }
  }
  const std::vector<std::vector<int32_t>> succ = op_successors(c);
  std::vector<std::set<int32_t>> node_succ(node_group.size());
  std::vector<int32_t> indegree(node_group.size(), 0);
  for (size_t i = 0; i < n; ++i)
    for (int32_t s : succ[i]) {
      const int32_t from = node[i], to = node[static_cast<size_t>(s)];
      if (from != to && node_succ[static_cast<size_t>(from)].insert(to).second) ++indegree[static_cast<size_t>(to)];
    }
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> ready;
  for (size_t k = 0; k < node_group.size(); ++k)
    if (indegree[k] == 0) ready.push(static_cast<int32_t>(k));

  Rebuild r(c);
  size_t emitted = 0;
  while (!ready.empty()) {
    const int32_t k = ready.top();
    ready.pop();
    ++emitted;
    const int32_t g = node_group[static_cast<size_t>(k)];
    if (g < 0) {
      r.copy(ops[static_cast<size_t>(node_op[static_cast<size_t>(k)])]);
    } else {
      MergedOp m = merge(static_cast<size_t>(g));
      if (!m.replaces.empty()) {  // else nothing reads the group: dead code, dropped
        const std::vector<int32_t>& members = groups[static_cast<size_t>(g)];
        int32_t absorbed = static_cast<int32_t>(members.size()) - 1;
        Phase phase = Phase::Forward;
        std::string scope;
        for (int32_t i : members) {
          const Op& op = ops[static_cast<size_t>(i)];
          absorbed += op.absorbed;
          phase = std::max(phase, op.phase);
          if (scope.empty()) scope = op.scope;
        }
        Circuit& out = r.out();
        std::vector<ValueId> outs = out.add_op(m.prim, std::move(m.params), r.at(m.inputs), scope);
        if (outs.size() != m.replaces.size())
          throw Error(pass + ": internal error, a merged op has " + std::to_string(outs.size()) + " outputs for " +
                      std::to_string(m.replaces.size()) + " values");
        out.set_absorbed(out.ops().size() - 1, absorbed);
        out.set_phase(out.ops().size() - 1, phase);
        for (size_t j = 0; j < outs.size(); ++j) r.map(m.replaces[j], outs[j]);
      }
    }
    for (int32_t s : node_succ[static_cast<size_t>(k)])
      if (--indegree[static_cast<size_t>(s)] == 0) ready.push(s);
  }
  if (emitted != node_group.size()) throw Error(pass + ": internal error, the contracted graph has a cycle");
  return r.finish(outputs);
}

}  // namespace kiln
