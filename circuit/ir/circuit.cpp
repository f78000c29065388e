// Circuit construction, verification, structural hashing/equality and the text dump.
#include <algorithm>
#include <unordered_map>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/hash.hpp>

namespace kiln {

namespace {
std::string value_type(const ValueInfo& info) { return std::string(dtype_name(info.dtype)) + info.shape.str(); }
}  // namespace

ValueId Circuit::add_external(ValueInfo info, ValueRole role, std::string name) {
  if (role == ValueRole::Computed) throw Error("Circuit::add_external: an external value cannot have role Computed");
  auto id = static_cast<ValueId>(values_.size());
  values_.push_back(Value{std::move(info), role, -1, std::move(name)});
  externals_.push_back(id);
  return id;
}

bool Op::is(PrimId id) const { return prim->id == id; }

std::vector<ValueId> Circuit::add_op(const std::string& prim_name, Params params, std::vector<ValueId> inputs,
                                     const std::string& scope) {
  return add_op(PrimRegistry::instance().find(prim_name), std::move(params), std::move(inputs), scope);
}

std::vector<ValueId> Circuit::add_op(PrimId id, Params params, std::vector<ValueId> inputs, const std::string& scope) {
  return add_op(PrimRegistry::instance().get(id), std::move(params), std::move(inputs), scope);
}

std::vector<ValueId> Circuit::add_op(const PrimDef& prim, Params params, std::vector<ValueId> inputs,
                                     const std::string& scope) {
  std::vector<ValueInfo> in_infos;
  for (ValueId v : inputs) {
    if (v < 0 || static_cast<size_t>(v) >= values_.size())
      fail(prim.name, scope, "input value %" + std::to_string(v) + " does not exist in this circuit");
    in_infos.push_back(values_[static_cast<size_t>(v)].info);
  }
  ShapeCtx ctx{prim, scope};
  std::vector<ValueInfo> out_infos = prim.shape(ctx, in_infos, params);
  Op op{&prim, std::move(params), std::move(inputs), {}, scope};
  op.phase = recording_phase_;
  auto op_index = static_cast<int32_t>(ops_.size());
  for (auto& info : out_infos) {
    auto id = static_cast<ValueId>(values_.size());
    values_.push_back(Value{std::move(info), ValueRole::Computed, op_index, {}});
    op.outputs.push_back(id);
  }
  ops_.push_back(std::move(op));
  return ops_.back().outputs;
}

void Circuit::replace_ops(const std::vector<OpReplacement>& replacements) {
  constexpr int32_t kCopied = -1, kRemoved = -2;
  std::vector<int32_t> role(ops_.size(), kCopied);  // else the replacement taking the op's place
  for (size_t k = 0; k < replacements.size(); ++k) {
    const OpReplacement& r = replacements[k];
    for (int32_t i : r.removed) {
      if (i < 0 || static_cast<size_t>(i) >= ops_.size() || role[static_cast<size_t>(i)] != kCopied)
        throw Error("Circuit::replace_ops: op #" + std::to_string(i) + " is not an op left to remove");
      role[static_cast<size_t>(i)] = kRemoved;
    }
    if (std::find(r.removed.begin(), r.removed.end(), r.at) == r.removed.end())
      throw Error("Circuit::replace_ops: the new op's place, op #" + std::to_string(r.at) + ", is not a removed op");
    role[static_cast<size_t>(r.at)] = static_cast<int32_t>(k);
  }
  // Every check before anything changes: a refused replacement leaves the circuit as it was.
  std::vector<char> dropped(values_.size(), 0);  // outputs of the removed ops that nothing keeps
  for (size_t i = 0; i < ops_.size(); ++i)
    if (role[i] != kCopied)
      for (ValueId o : ops_[i].outputs) dropped[static_cast<size_t>(o)] = 1;
  std::vector<std::vector<ValueInfo>> out_infos;
  for (const OpReplacement& r : replacements) {
    const std::string& scope = ops_[static_cast<size_t>(r.at)].scope;
    std::vector<ValueInfo> in_infos;
    for (ValueId v : r.inputs) {
      if (v < 0 || static_cast<size_t>(v) >= values_.size())
        fail(r.prim->name, scope, "replace_ops: input %" + std::to_string(v) + " does not exist in this circuit");
      in_infos.push_back(info(v));
    }
    ShapeCtx ctx{*r.prim, scope};
    out_infos.push_back(r.prim->shape(ctx, in_infos, r.params));
    if (r.kept.size() > out_infos.back().size())
      fail(r.prim->name, scope,
           "replace_ops: keeps " + std::to_string(r.kept.size()) + " values, the op has " +
               std::to_string(out_infos.back().size()) + " outputs");
    for (size_t j = 0; j < r.kept.size(); ++j) {
      const ValueId v = r.kept[j];
      if (v < 0 || static_cast<size_t>(v) >= values_.size() || dropped[static_cast<size_t>(v)] != 1)
        fail(r.prim->name, scope,
             "replace_ops: kept value %" + std::to_string(v) + " is not an output of a removed op (or is kept twice)");
      if (info(v) != out_infos.back()[j])
        fail(r.prim->name, scope,
             "replace_ops: kept value %" + std::to_string(v) + " is " + value_type(info(v)) + ", the op's output " +
                 std::to_string(j) + " " + value_type(out_infos.back()[j]));
      dropped[static_cast<size_t>(v)] = 0;
    }
  }
  auto refuse_dropped_reads = [&](const std::vector<ValueId>& inputs, const PrimDef& prim, const std::string& scope) {
    for (ValueId v : inputs)
      if (dropped[static_cast<size_t>(v)])
        fail(prim.name, scope, "replace_ops: reads %" + std::to_string(v) + ", an output of a removed op");
  };
  for (size_t i = 0; i < ops_.size(); ++i)
    if (role[i] == kCopied) refuse_dropped_reads(ops_[i].inputs, *ops_[i].prim, ops_[i].scope);
  for (const OpReplacement& r : replacements)
    refuse_dropped_reads(r.inputs, *r.prim, ops_[static_cast<size_t>(r.at)].scope);

  std::vector<Op> ops;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (role[i] == kCopied) ops.push_back(std::move(ops_[i]));
    if (role[i] < 0) continue;
    const auto k = static_cast<size_t>(role[i]);
    const OpReplacement& r = replacements[k];
    Op op{r.prim, r.params, r.inputs, r.kept, ops_[i].scope, static_cast<int32_t>(r.removed.size()), ops_[i].phase};
    for (size_t j = r.kept.size(); j < out_infos[k].size(); ++j) {
      op.outputs.push_back(static_cast<ValueId>(values_.size()));
      values_.push_back(Value{std::move(out_infos[k][j]), ValueRole::Computed, -1, {}});
    }
    ops.push_back(std::move(op));
  }
  ops_ = std::move(ops);
  for (Value& v : values_)
    if (v.role == ValueRole::Computed) v.producer = -1;
  for (size_t i = 0; i < ops_.size(); ++i)
    for (ValueId o : ops_[i].outputs) values_[static_cast<size_t>(o)].producer = static_cast<int32_t>(i);
  verify();
}

ValueId Circuit::assign_root(ValueId id) const {
  while (true) {
    const Value& v = value(id);
    if (v.role == ValueRole::Persistent) return id;
    if (v.producer < 0) return kNoValue;
    const Op& op = ops_[static_cast<size_t>(v.producer)];
    if (!op.is(PrimId::assign)) return kNoValue;
    id = op.inputs[0];
  }
}

Circuit Circuit::subset(const std::vector<int32_t>& keep_ops, std::vector<ValueId>* remap) const {
  Circuit out;
  std::vector<ValueId> map(values_.size(), kNoValue);
  for (ValueId e : externals_) {
    const Value& v = value(e);
    map[static_cast<size_t>(e)] = out.add_external(v.info, v.role, v.name);
  }
  for (int32_t i : keep_ops) {
    const Op& op = ops_[static_cast<size_t>(i)];
    Op copy = op;
    for (ValueId& in : copy.inputs) {
      in = map[static_cast<size_t>(in)];
      if (in == kNoValue) throw Error("Circuit::subset: op '" + op.prim->name + "' kept without its inputs");
    }
    auto op_index = static_cast<int32_t>(out.ops_.size());
    for (ValueId& o : copy.outputs) {
      auto id = static_cast<ValueId>(out.values_.size());
      out.values_.push_back(Value{value(o).info, ValueRole::Computed, op_index, {}});
      map[static_cast<size_t>(o)] = id;
      o = id;
    }
    out.ops_.push_back(std::move(copy));
  }
  if (remap) *remap = std::move(map);
  return out;
}

void Circuit::replace_uses(const std::vector<ValueId>& rename, bool keep_assign_targets) {
  for (Op& op : ops_)
    for (size_t k = 0; k < op.inputs.size(); ++k)
      if (!(keep_assign_targets && op.prim->side_effect && k == 0))
        op.inputs[k] = rename.at(static_cast<size_t>(op.inputs[k]));
}

void Circuit::verify() const {
  std::vector<char> defined(values_.size(), 0);
  for (ValueId e : externals_) defined[static_cast<size_t>(e)] = 1;
  // For each value that is some version of a persistent buffer: the op index that overwrote it.
  std::unordered_map<ValueId, int32_t> overwritten_at;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    for (ValueId in : op.inputs) {
      if (in < 0 || static_cast<size_t>(in) >= values_.size() || !defined[static_cast<size_t>(in)])
        fail(op.prim->name, op.scope, "reads %" + std::to_string(in) + " before it is defined");
      auto it = overwritten_at.find(in);
      if (it != overwritten_at.end() && it->second < static_cast<int32_t>(i))
        fail(op.prim->name, op.scope,
             "reads %" + std::to_string(in) + " after op #" + std::to_string(it->second) +
                 " assigned that buffer; reads of a buffer's old value must come before the assign");
    }
    if (op.is(PrimId::assign)) {
      ValueId target = op.inputs[0];
      if (assign_root(target) == kNoValue)
        fail("assign", op.scope, "target %" + std::to_string(target) + " is not a persistent buffer");
      // A second assign of the same version reads it after the first: caught above.
      overwritten_at.emplace(target, static_cast<int32_t>(i));
    }
    for (ValueId o : op.outputs) defined[static_cast<size_t>(o)] = 1;
  }
}

uint64_t Circuit::structural_hash() const {
  uint64_t h = hash_combine(0xC12C017ULL, values_.size());
  for (ValueId e : externals_) {
    const Value& v = value(e);
    h = hash_combine(h, static_cast<uint64_t>(e));
    h = hash_combine(h, static_cast<uint64_t>(v.role));
    h = hash_combine(h, static_cast<uint64_t>(v.info.dtype));
    for (int64_t d : v.info.shape.dims()) h = hash_combine(h, static_cast<uint64_t>(d));
  }
  for (const Op& op : ops_) {
    h = hash_combine(h, std::hash<std::string>{}(op.prim->name));
    h = hash_combine(h, op.params.hash());
    for (ValueId in : op.inputs) h = hash_combine(h, static_cast<uint64_t>(in));
    h = hash_combine(h, 0xFFFF);
    for (ValueId o : op.outputs) {
      const ValueInfo& info = value(o).info;
      h = hash_combine(h, static_cast<uint64_t>(info.dtype));
      for (int64_t d : info.shape.dims()) h = hash_combine(h, static_cast<uint64_t>(d));
    }
  }
  return h;
}

bool Circuit::structurally_equal(const Circuit& o) const {
  if (values_.size() != o.values_.size() || ops_.size() != o.ops_.size() || externals_ != o.externals_) return false;
  for (size_t i = 0; i < values_.size(); ++i)
    if (values_[i].info != o.values_[i].info || values_[i].role != o.values_[i].role) return false;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op &a = ops_[i], &b = o.ops_[i];
    if (a.prim != b.prim || a.inputs != b.inputs || a.outputs != b.outputs || !(a.params == b.params)) return false;
  }
  return true;
}

std::string Circuit::dump(const std::string& title) const {
  std::string s;
  if (!title.empty()) s += "== " + title + " (" + std::to_string(ops_.size()) + " ops)\n";
  static const char* kRole[] = {"computed", "input", "persistent"};
  for (ValueId e : externals_) {
    const Value& v = value(e);
    s += "  %" + std::to_string(e) + " = " + kRole[static_cast<int>(v.role)];
    if (!v.name.empty()) s += " '" + v.name + "'";
    s += " : " + value_type(v.info) + "\n";
  }
  for (const Op& op : ops_) {
    std::string line = "  ";
    for (size_t i = 0; i < op.outputs.size(); ++i) line += (i ? ", %" : "%") + std::to_string(op.outputs[i]);
    line += " = " + op.prim->name + "(";
    for (size_t i = 0; i < op.inputs.size(); ++i) line += (i ? ", %" : "%") + std::to_string(op.inputs[i]);
    line += ")";
    if (op.prim->describe) {
      std::string d = op.prim->describe(op.params);
      if (!d.empty()) line += " " + d;
    }
    line += " : ";
    for (size_t i = 0; i < op.outputs.size(); ++i) line += (i ? ", " : "") + value_type(value(op.outputs[i]).info);
    if (!op.scope.empty()) line += "   # " + op.scope;
    if (op.absorbed > 0) line += "   [fused: absorbed " + std::to_string(op.absorbed) + " ops]";
    s += line + "\n";
  }
  return s;
}

}  // namespace kiln
