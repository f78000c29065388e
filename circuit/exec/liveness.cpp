// Buffer lifetimes (see liveness.hpp).
#include <algorithm>

#include <kiln/circuit/exec/liveness.hpp>

namespace kiln {

Liveness buffer_liveness(const Circuit& c, const std::vector<ValueId>& outputs, const std::vector<int>& alias_input) {
  const auto& ops = c.ops();
  const auto end = static_cast<int32_t>(ops.size());
  Liveness l;
  l.root.resize(c.num_values());
  for (size_t v = 0; v < l.root.size(); ++v) l.root[v] = static_cast<ValueId>(v);
  auto root = [&](ValueId v) { return static_cast<size_t>(l.root[static_cast<size_t>(v)]); };
  std::vector<int32_t> last_use(c.num_values(), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (alias_input[i] >= 0)
      l.root[static_cast<size_t>(ops[i].outputs[0])] = l.root[root(ops[i].inputs[static_cast<size_t>(alias_input[i])])];
    for (ValueId in : ops[i].inputs) last_use[root(in)] = static_cast<int32_t>(i);
    for (ValueId out : ops[i].outputs) last_use[root(out)] = std::max(last_use[root(out)], static_cast<int32_t>(i));
  }
  for (ValueId o : outputs) last_use[root(o)] = end;
  for (const Op& op : ops)
    if (op.prim->side_effect) last_use[root(op.outputs[0])] = end;
  l.free_after.resize(ops.size());
  for (size_t v = 0; v < c.num_values(); ++v) {
    if (l.root[v] != static_cast<ValueId>(v) || c.value(static_cast<ValueId>(v)).role != ValueRole::Computed) continue;
    if (last_use[v] >= 0 && last_use[v] < end)
      l.free_after[static_cast<size_t>(last_use[v])].push_back(static_cast<ValueId>(v));
  }
  return l;
}

}  // namespace kiln
