// DCE, CSE, assign forwarding and ordered scatter sums over Circuits.
#include <algorithm>
#include <string>
#include <unordered_map>

#include <kiln/circuit/ir/hash.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

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

namespace {

// True if v is iota(0, 1, ..., n - 1) as i32, of shape [n].
bool is_arange(const Circuit& c, ValueId v, int64_t n) {
  const int32_t p = c.value(v).producer;
  if (p < 0) return false;
  const Op& op = c.ops()[static_cast<size_t>(p)];
  return op.is(PrimId::iota) && c.info(v).shape == Shape{n} && op.params.index == ix::coord(0) &&
         op.params.dtype == DType::i32;
}

}  // namespace

Circuit simplify_row_indexing(const Circuit& c, std::vector<ValueId>& outputs) {
  const auto& ops = c.ops();
  std::vector<int32_t> last_reader(c.num_values(), -1), assigned_at(c.num_values(), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    for (ValueId in : ops[i].inputs) last_reader[static_cast<size_t>(in)] = static_cast<int32_t>(i);
    if (ops[i].prim->side_effect) assigned_at[static_cast<size_t>(ops[i].inputs[0])] = static_cast<int32_t>(i);
  }
  std::vector<ValueId> rename(c.num_values());
  for (size_t v = 0; v < rename.size(); ++v) rename[v] = static_cast<ValueId>(v);
  std::vector<bool> requested(c.num_values(), false);  // stay values of their own
  for (ValueId o : outputs) requested[static_cast<size_t>(o)] = true;
  bool changed = false;
  for (const Op& op : ops) {
    if (op.outputs.empty() || requested[static_cast<size_t>(op.outputs[0])]) continue;
    const ValueId out = op.outputs[0];
    if (op.is(PrimId::gather_rows)) {
      const ValueId table = op.inputs[0];
      const int32_t a = assigned_at[static_cast<size_t>(table)];
      if (c.info(table) == c.info(out) && is_arange(c, op.inputs[1], c.info(table).shape[0]) &&
          (a < 0 || last_reader[static_cast<size_t>(out)] < a)) {
        rename[static_cast<size_t>(out)] = table;
        changed = true;
      }
    } else if (op.is(PrimId::scatter_add_rows)) {
      const ValueId src = op.inputs[1];
      if (c.info(src) == c.info(out) && is_arange(c, op.inputs[0], ScatterAddRowsParams::of(op).rows)) {
        rename[static_cast<size_t>(out)] = src;
        changed = true;
      }
    }
  }
  if (!changed) return c;
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
  Rebuild r(c);
  for (const Op& op : c.ops()) {
    if (!op.is(PrimId::scatter_add_rows)) {
      r.copy(op);
      continue;
    }
    const Params ordered = ScatterAddRowsParams{ScatterAddRowsParams::of(op).rows, true}.to_params();
    r.copy(op, &ordered);
  }
  return r.finish(outputs);
}

}  // namespace kiln
