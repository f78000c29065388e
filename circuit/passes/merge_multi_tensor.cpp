// Multi-tensor merge: the optimizer's per-tensor elementwise work becomes multi_tensor ops
// (see fusion.hpp for the rules, multi_tensor.hpp for the op).
#include <algorithm>
#include <map>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/fusion.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/multi_tensor.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

// One tensor's elementwise work: the ops it consists of (ascending), its bodies over its
// inputs, and the values it stands for (one per body).
struct Work {
  std::vector<int32_t> ops;
  bool sum = false;
  std::vector<ScalarExp> bodies;
  std::vector<ValueId> inputs, replaces;
  std::string key;  // equal keys: the same program over tensors of possibly different shapes
};

bool is_scalar_of(const Shape& s, const Shape& domain) { return s.numel() == 1 && s.rank() <= domain.rank(); }

// The work of a candidate op (an update-phase pointwise op, an element group, or a reduce_all
// sum and the pointwise body only it reads), or nothing.
bool work_of(const Circuit& c, int32_t i, const std::vector<int>& readers, const std::vector<bool>& protect, Work* w) {
  const Op& op = c.ops()[static_cast<size_t>(i)];
  if (op.phase != Phase::Update) return false;
  const PrimId p = op.prim->id;
  Shape domain;
  if (p == PrimId::pointwise) {
    domain = c.info(op.outputs[0]).shape;
    *w = {{i}, false, {op.params.body}, op.inputs, op.outputs, ""};
  } else if (p == PrimId::fused_rows) {
    const RowProgram rp = RowProgram::from_params(op.params);
    if (!rp.reduction_bodies.empty()) return false;
    for (size_t o = 0; o < rp.output_per_row.size(); ++o)
      // multi_tensor stores one dtype, every output in the domain's shape
      if (rp.output_per_row[o] || rp.stored_bf16(o) || rp.padding(o) > 0) return false;
    domain = rp.domain;
    *w = {{i}, false, rp.output_bodies, op.inputs, op.outputs, ""};
  } else if (p == PrimId::reduce_all && ReduceParams::of(op).kind == ReduceKind::Sum) {
    const ValueId x = op.inputs[0];
    domain = c.info(x).shape;
    *w = {{i}, true, {se::in(0)}, {x}, op.outputs, ""};
    const int32_t q = c.value(x).producer;
    if (q >= 0 && c.ops()[static_cast<size_t>(q)].is(PrimId::pointwise) && readers[static_cast<size_t>(x)] == 1 &&
        !protect[static_cast<size_t>(x)] && c.ops()[static_cast<size_t>(q)].phase == Phase::Update) {
      const Op& body_op = c.ops()[static_cast<size_t>(q)];
      *w = {{q, i}, true, {body_op.params.body}, body_op.inputs, op.outputs, ""};
    }
  } else {
    return false;
  }
  if (domain.numel() <= 1) return false;
  // An input read twice (g * g) is one input.
  std::vector<ValueId> unique;
  std::vector<ScalarExp> renumber;
  for (ValueId in : w->inputs) {
    auto at = std::find(unique.begin(), unique.end(), in);
    renumber.push_back(se::in(static_cast<int>(at - unique.begin())));
    if (at == unique.end()) unique.push_back(in);
  }
  w->inputs = unique;
  for (ScalarExp& e : w->bodies) e = e.substitute(renumber);
  const DType dt = c.info(w->replaces[0]).dtype;
  w->key = std::string(w->sum ? "sum " : "map ") + dtype_name(dt);
  for (ValueId in : w->inputs) {
    const ValueInfo& info = c.info(in);
    if (info.dtype != dt || (info.shape != domain && !is_scalar_of(info.shape, domain))) return false;
    w->key += info.shape == domain ? " D" : " S";
  }
  for (const ScalarExp& e : w->bodies) w->key += " {" + e.str() + "}";
  return true;
}

using Bits = std::vector<uint64_t>;
void set_bit(Bits& b, int32_t i) { b[static_cast<size_t>(i) / 64] |= uint64_t{1} << (i % 64); }
bool intersects(const Bits& a, const Bits& b) {
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k] & b[k]) return true;
  return false;
}
void unite(Bits& a, const Bits& b) {
  for (size_t k = 0; k < a.size(); ++k) a[k] |= b[k];
}

// The multi_tensor op of `works` (two or more, one key): positions whose input is the same
// scalar in every work become shared inputs.
MergedOp merged(const Circuit& c, const std::vector<Work>& works) {
  const Work& first = works.front();
  const size_t m = first.inputs.size();
  std::vector<bool> shared(m);
  for (size_t j = 0; j < m; ++j) shared[j] = c.info(first.inputs[j]).shape.numel() == 1;
  for (const Work& w : works)
    for (size_t j = 0; j < m; ++j) shared[j] = shared[j] && w.inputs[j] == first.inputs[j];
  MultiTensorProgram mp;
  mp.groups = static_cast<int>(works.size());
  mp.sum = first.sum;
  std::vector<ScalarExp> renumber(m);
  for (size_t j = 0; j < m; ++j)
    if (!shared[j]) renumber[j] = se::in(mp.group_inputs++);
  for (size_t j = 0; j < m; ++j)
    if (shared[j]) renumber[j] = se::in(mp.group_inputs + mp.shared_inputs++);
  for (const ScalarExp& e : first.bodies) mp.bodies.push_back(e.substitute(renumber));
  MergedOp op{PrimId::multi_tensor, mp.to_params(c.info(first.replaces[0]).dtype), {}, {}};
  for (const Work& w : works) {
    for (size_t j = 0; j < m; ++j)
      if (!shared[j]) op.inputs.push_back(w.inputs[j]);
    op.replaces.insert(op.replaces.end(), w.replaces.begin(), w.replaces.end());
  }
  for (size_t j = 0; j < m; ++j)
    if (shared[j]) op.inputs.push_back(first.inputs[j]);
  return op;
}

// Merges the first key with two or more independent works; false if there is none.
bool merge_one_key(Circuit& c, std::vector<ValueId>& outputs) {
  const auto& ops = c.ops();
  const size_t n = ops.size();
  std::vector<int> readers(c.num_values(), 0);
  for (const Op& op : ops)
    for (ValueId in : op.inputs) ++readers[static_cast<size_t>(in)];
  std::vector<bool> protect(c.num_values(), false);
  for (ValueId o : outputs) protect[static_cast<size_t>(o)] = true;
  std::vector<Work> works;
  std::vector<bool> in_work(n, false);
  for (size_t i = n; i-- > 0;) {  // last ops first, so a reduce_all claims its body first
    Work w;
    if (in_work[i] || !work_of(c, static_cast<int32_t>(i), readers, protect, &w)) continue;
    bool taken = false;
    for (int32_t k : w.ops) taken = taken || in_work[static_cast<size_t>(k)];
    if (taken) continue;
    for (int32_t k : w.ops) in_work[static_cast<size_t>(k)] = true;
    works.push_back(std::move(w));
  }
  if (works.size() < 2) return false;
  std::reverse(works.begin(), works.end());
  std::map<std::string, std::vector<size_t>> by_key;
  std::vector<std::string> keys;  // in order of first appearance
  for (size_t k = 0; k < works.size(); ++k) {
    if (!by_key.count(works[k].key)) keys.push_back(works[k].key);
    by_key[works[k].key].push_back(k);
  }
  // Descendants of each op (data and buffer-order edges), as bit sets.
  const std::vector<std::vector<int32_t>> succ = op_successors(c);
  const size_t words = (n + 63) / 64;
  std::vector<Bits> below(n, Bits(words, 0));
  for (size_t i = n; i-- > 0;)
    for (int32_t s : succ[i]) {
      set_bit(below[i], s);
      unite(below[i], below[static_cast<size_t>(s)]);
    }
  for (const std::string& key : keys) {
    // Greedily, in op order: a work joins when it neither reaches nor is reached by the chosen.
    std::vector<Work> chosen;
    Bits chosen_ops(words, 0), chosen_below(words, 0);
    for (size_t k : by_key[key]) {
      Bits mine(words, 0), my_below(words, 0);
      for (int32_t o : works[k].ops) {
        set_bit(mine, o);
        unite(my_below, below[static_cast<size_t>(o)]);
      }
      if (intersects(mine, chosen_below) || intersects(my_below, chosen_ops)) continue;
      unite(chosen_ops, mine);
      unite(chosen_below, my_below);
      chosen.push_back(works[k]);
    }
    if (chosen.size() < 2) continue;
    std::vector<int32_t> group;
    for (const Work& w : chosen) group.insert(group.end(), w.ops.begin(), w.ops.end());
    std::sort(group.begin(), group.end());
    c = contract_groups(
        c, {group}, [&](size_t) { return merged(c, chosen); }, outputs, "merge_multi_tensor");
    return true;
  }
  return false;
}

// A summed multi_tensor op whose group sums one scalar pointwise op reads, and nothing else,
// takes that op's body as its total (clipping's global norm: one launch, not a sums launch and
// a scalar kernel). One op at a time; false if there is none.
bool absorb_one_total(Circuit& c, std::vector<ValueId>& outputs) {
  const auto& ops = c.ops();
  std::vector<std::vector<int32_t>> readers = value_readers(c);
  for (ValueId o : outputs) readers[static_cast<size_t>(o)].push_back(-1);  // protected
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].is(PrimId::multi_tensor)) continue;
    MultiTensorProgram mp = MultiTensorProgram::from_params(ops[i].params);
    if (!mp.sum || mp.has_total) continue;
    const std::vector<int32_t>& first_readers = readers[static_cast<size_t>(ops[i].outputs[0])];
    if (first_readers.empty() || first_readers[0] < 0) continue;
    const int32_t p = first_readers[0];
    const Op& reader = ops[static_cast<size_t>(p)];
    if (!reader.is(PrimId::pointwise) || c.info(reader.outputs[0]).shape != Shape{}) continue;
    bool only = true;
    for (ValueId o : ops[i].outputs)
      for (int32_t r : readers[static_cast<size_t>(o)]) only = only && r == p;
    std::vector<ScalarExp> subs;
    for (ValueId in : reader.inputs) {
      auto at = std::find(ops[i].outputs.begin(), ops[i].outputs.end(), in);
      only = only && at != ops[i].outputs.end();
      subs.push_back(se::in(static_cast<int>(at - ops[i].outputs.begin())));
    }
    if (!only) continue;
    mp.has_total = true;
    mp.total = reader.params.body.substitute(subs);
    const MergedOp m{PrimId::multi_tensor, mp.to_params(ops[i].params.dtype), ops[i].inputs, {reader.outputs[0]}};
    c = contract_groups(
        c, {{static_cast<int32_t>(i), p}}, [&](size_t) { return m; }, outputs, "merge_multi_tensor");
    return true;
  }
  return false;
}

}  // namespace

Circuit merge_multi_tensor(const Circuit& c, std::vector<ValueId>& outputs) {
  Circuit out = c;
  while (merge_one_key(out, outputs)) {
  }
  while (absorb_one_total(out, outputs)) {
  }
  return out;
}

}  // namespace kiln
