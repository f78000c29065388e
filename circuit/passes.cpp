// DCE, CSE, assign forwarding and ordered scatter sums over Circuits.
#include "circuit/passes.hpp"

#include <algorithm>
#include <unordered_map>

#include "circuit/hash.hpp"

namespace kiln {

Circuit dce(const Circuit& c, std::vector<ValueId>& outputs) {
  std::vector<char> live(c.num_values(), 0);
  for (ValueId o : outputs) live[static_cast<size_t>(o)] = 1;
  const auto& ops = c.ops();
  std::vector<int32_t> keep;
  for (auto i = static_cast<int32_t>(ops.size()) - 1; i >= 0; --i) {
    const Op& op = ops[static_cast<size_t>(i)];
    bool needed = op.prim->side_effect;
    for (ValueId o : op.outputs) needed = needed || live[static_cast<size_t>(o)];
    if (!needed) continue;
    keep.push_back(i);
    for (ValueId in : op.inputs) live[static_cast<size_t>(in)] = 1;
  }
  std::reverse(keep.begin(), keep.end());
  std::vector<ValueId> remap;
  Circuit out = c.subset(keep, &remap);
  for (ValueId& o : outputs) o = remap[static_cast<size_t>(o)];
  return out;
}

Circuit cse(const Circuit& c, std::vector<ValueId>& outputs) {
  struct Key {
    const PrimDef* prim;
    const Params* params;
    std::vector<ValueId> inputs;
  };
  std::vector<ValueId> rename(c.num_values());
  for (size_t v = 0; v < rename.size(); ++v) rename[v] = static_cast<ValueId>(v);
  std::vector<std::pair<Key, std::vector<ValueId>>> table;
  std::unordered_multimap<uint64_t, size_t> index;
  for (const Op& op : c.ops()) {
    std::vector<ValueId> inputs;
    for (ValueId in : op.inputs) inputs.push_back(rename[static_cast<size_t>(in)]);
    if (op.prim->side_effect) continue;
    uint64_t h = hash_combine(std::hash<const void*>{}(op.prim), op.params.hash());
    for (ValueId in : inputs) h = hash_combine(h, static_cast<uint64_t>(in));
    bool merged = false;
    auto [lo, hi] = index.equal_range(h);
    for (auto it = lo; it != hi && !merged; ++it) {
      const auto& [key, outs] = table[it->second];
      if (key.prim == op.prim && key.inputs == inputs && *key.params == op.params) {
        for (size_t k = 0; k < outs.size(); ++k) rename[static_cast<size_t>(op.outputs[k])] = outs[k];
        merged = true;
      }
    }
    if (!merged) {
      index.emplace(h, table.size());
      table.push_back({Key{op.prim, &op.params, inputs}, op.outputs});
    }
  }
  Circuit renamed = c;
  renamed.replace_uses(rename);
  for (ValueId& o : outputs) o = rename[static_cast<size_t>(o)];
  return dce(renamed, outputs);
}

Circuit forward_assigned_values(const Circuit& c) {
  std::vector<ValueId> rename(c.num_values());
  for (size_t v = 0; v < rename.size(); ++v) rename[v] = static_cast<ValueId>(v);
  for (const Op& op : c.ops())
    if (op.prim->side_effect) rename[static_cast<size_t>(op.outputs[0])] = rename[static_cast<size_t>(op.inputs[1])];
  Circuit out = c;
  out.replace_uses(rename, /*keep_assign_targets=*/true);
  return out;
}

Circuit ordered_scatter_sums(const Circuit& c, std::vector<ValueId>& outputs) {
  Circuit out;
  std::vector<ValueId> remap(c.num_values(), kNoValue);
  for (ValueId x : c.externals()) {
    const Value& v = c.value(x);
    remap[static_cast<size_t>(x)] = out.add_external(v.info, v.role, v.name);
  }
  for (const Op& op : c.ops()) {
    std::vector<ValueId> inputs;
    for (ValueId in : op.inputs) inputs.push_back(remap[static_cast<size_t>(in)]);
    Params params = op.params;
    if (op.prim->name == "scatter_add_rows") params.ints = {params.ints[0], 1};
    std::vector<ValueId> outs = out.add_op(op.prim->name, std::move(params), inputs, op.scope);
    out.set_absorbed(out.ops().size() - 1, op.absorbed);
    out.set_phase(out.ops().size() - 1, op.phase);
    for (size_t k = 0; k < outs.size(); ++k) remap[static_cast<size_t>(op.outputs[k])] = outs[k];
  }
  for (ValueId& o : outputs) o = remap[static_cast<size_t>(o)];
  return out;
}

}  // namespace kiln
