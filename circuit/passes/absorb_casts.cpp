// absorb_casts (absorb_casts.hpp): casts to bf16 of fused_rows outputs, fused_matmul epilogues
// and attention outputs written by the op itself.
#include <algorithm>
#include <map>

#include <kiln/circuit/passes/absorb_casts.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/fused_matmul.hpp>
#include <kiln/circuit/prims/fused_rows.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

namespace {

// A cast f32 -> bf16 of an output of an f32 fused_rows op, or of an epilogue of an f32
// fused_matmul op (not its row sums).
bool absorbable(const Circuit& c, const Op& op) {
  if (!op.is(PrimId::cast) || op.params.dtype != DType::bf16) return false;
  const ValueId x = op.inputs[0];
  const int32_t producer = c.value(x).producer;
  if (producer < 0 || c.info(x).dtype != DType::f32) return false;
  const Op& p = c.ops()[static_cast<size_t>(producer)];
  if (p.params.dtype != DType::f32 || phases_kept_apart(p.phase, op.phase)) return false;
  if (p.is(PrimId::fused_rows)) return true;
  return p.is(PrimId::fused_matmul) &&
         static_cast<size_t>(std::find(p.outputs.begin(), p.outputs.end(), x) - p.outputs.begin()) <
             FusedMatmul::from_params(p.params).epilogues.size();
}

// An op's outputs as its program keeps them: fused_rows outputs (with per-row flags and
// padding) or fused_matmul epilogues (its row sums, last, are not among them).
struct Outputs {
  std::vector<ScalarExp> bodies;
  std::vector<bool> per_row, bf16;
  std::vector<int64_t> pad;
};

Circuit absorb_row_and_matmul_casts(const Circuit& c, std::vector<ValueId>& outputs) {
  // Per producing op (index), the casts (indices) that read its outputs.
  std::map<int32_t, std::vector<int32_t>> casts_of;
  for (size_t i = 0; i < c.ops().size(); ++i)
    if (absorbable(c, c.ops()[i])) casts_of[c.value(c.ops()[i].inputs[0]).producer].push_back(static_cast<int32_t>(i));
  if (casts_of.empty()) return c;
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<bool> requested(c.num_values(), false);
  for (ValueId o : outputs) requested[static_cast<size_t>(o)] = true;
  const std::vector<std::vector<int32_t>> groups = producer_groups(casts_of);
  auto merge = [&](size_t g) {
    const std::vector<int32_t>& group = groups[g];
    const Op& producer = c.ops()[static_cast<size_t>(group[0])];
    const bool rows = producer.is(PrimId::fused_rows);
    RowProgram rp;
    FusedMatmul fm;
    Outputs old, now;
    if (rows) {
      rp = RowProgram::from_params(producer.params);
      old = {rp.output_bodies, rp.output_per_row, {}, {}};
      for (size_t o = 0; o < rp.output_bodies.size(); ++o) {
        old.bf16.push_back(rp.stored_bf16(o));
        old.pad.push_back(rp.padding(o));
      }
    } else {
      fm = FusedMatmul::from_params(producer.params);
      old = {fm.epilogues,
             std::vector<bool>(fm.epilogues.size(), false),
             {},
             std::vector<int64_t>(fm.epilogues.size(), 0)};
      for (size_t r = 0; r < fm.epilogues.size(); ++r) old.bf16.push_back(fm.stored_bf16(r));
    }
    MergedOp m{producer.prim->id, {}, producer.inputs, {}};
    auto add = [&](size_t o, bool bf16, ValueId stands_for) {
      now.bodies.push_back(old.bodies[o]);
      now.per_row.push_back(old.per_row[o]);
      now.bf16.push_back(bf16);
      now.pad.push_back(old.pad[o]);  // a cast of padded rows is padded the same
      m.replaces.push_back(stands_for);
    };
    // The outputs something other than the group's casts reads (or that are requested).
    for (size_t o = 0; o < old.bodies.size(); ++o) {
      const ValueId v = producer.outputs[o];
      bool needed = requested[static_cast<size_t>(v)];
      for (int32_t r : readers[static_cast<size_t>(v)])
        needed = needed || std::find(group.begin() + 1, group.end(), r) == group.end();
      if (needed) add(o, old.bf16[o], v);
    }
    // Then one bf16 output for each cast.
    for (size_t j = 1; j < group.size(); ++j) {
      const Op& cast = c.ops()[static_cast<size_t>(group[j])];
      add(static_cast<size_t>(std::find(producer.outputs.begin(), producer.outputs.end(), cast.inputs[0]) -
                              producer.outputs.begin()),
          true, cast.outputs[0]);
    }
    if (rows) {
      rp.output_bodies = now.bodies;
      rp.output_per_row = now.per_row;
      rp.output_bf16 = now.bf16;
      rp.output_pad = now.pad;
      m.params = rp.to_params(producer.params.dtype);
    } else {
      fm.epilogues = now.bodies;
      fm.epilogue_bf16 = now.bf16;
      if (fm.a_row_sums || fm.block_sums) m.replaces.push_back(producer.outputs.back());  // after the epilogues
      m.params = fm.to_params(producer.params.dtype);
    }
    return m;
  };
  return contract_groups(c, groups, merge, outputs, "absorb_casts");
}

// A cast f32 -> bf16 that reads v, directly or through one reshape: the cast op's index, or -1.
struct CastOf {
  int32_t cast = -1, reshape = -1;
};
CastOf bf16_cast_of(const Circuit& c, ValueId v, const std::vector<std::vector<int32_t>>& readers) {
  const Phase made_in = c.ops()[static_cast<size_t>(c.value(v).producer)].phase;
  auto is_bf16_cast = [&](int32_t i) {
    const Op& op = c.ops()[static_cast<size_t>(i)];
    return op.is(PrimId::cast) && op.params.dtype == DType::bf16 && !phases_kept_apart(made_in, op.phase);
  };
  for (int32_t r : readers[static_cast<size_t>(v)]) {
    if (is_bf16_cast(r)) return {r, -1};
    const Op& op = c.ops()[static_cast<size_t>(r)];
    if (op.is(PrimId::reshape))
      for (int32_t rr : readers[static_cast<size_t>(op.outputs[0])])
        if (is_bf16_cast(rr)) return {rr, r};
  }
  return {};
}

// The attention ops' part: an f32 attention (attention_grad) op each of whose main outputs (o;
// the gradients) a cast to bf16 reads, directly or through a reshape, writes bf16 copies of them
// (AttentionParams::bf16_copies), and each such cast becomes the copy (or the same reshape of
// it). The f32 outputs stay: attention_grad reads o, the bias sum the gradient.
Circuit absorb_attention_casts(const Circuit& c, std::vector<ValueId>& outputs) {
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::map<int32_t, std::vector<CastOf>> absorbing;  // attention op -> the cast of each main output
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    if (!op.is(PrimId::attention) && !op.is(PrimId::attention_grad)) continue;
    if (c.info(op.outputs[0]).dtype != DType::f32) continue;
    if (AttentionParams::of(op).bf16_copies) continue;
    const size_t main = op.is(PrimId::attention) ? 1 : op.outputs.size();
    std::vector<CastOf> casts;
    for (size_t o = 0; o < main; ++o) casts.push_back(bf16_cast_of(c, op.outputs[o], readers));
    if (std::all_of(casts.begin(), casts.end(), [](const CastOf& k) { return k.cast >= 0; }))
      absorbing[static_cast<int32_t>(i)] = casts;
  }
  if (absorbing.empty()) return c;
  std::map<int32_t, std::pair<ValueId, int32_t>> copy_for_cast;  // cast op -> (its copy, the reshape or -1)
  Rebuild r(c);
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const Op& op = c.ops()[i];
    if (auto it = absorbing.find(static_cast<int32_t>(i)); it != absorbing.end()) {
      AttentionParams a = AttentionParams::of(op);
      a.bf16_copies = true;
      const std::vector<ValueId> outs = r.emit(op, a.to_params(), r.at(op.inputs));
      r.out().set_absorbed(r.out().ops().size() - 1, op.absorbed + static_cast<int>(it->second.size()));
      for (size_t k = 0; k < op.outputs.size(); ++k) r.map(op.outputs[k], outs[k]);
      for (size_t k = 0; k < it->second.size(); ++k)
        copy_for_cast[it->second[k].cast] = {outs[op.outputs.size() + k], it->second[k].reshape};
      continue;
    }
    if (auto it = copy_for_cast.find(static_cast<int32_t>(i)); it != copy_for_cast.end()) {
      const auto [copy, reshape] = it->second;
      if (reshape < 0) {
        r.map(op.outputs[0], copy);
      } else {
        r.out().set_recording_phase(op.phase);
        Builder b(r.out(), op.scope);
        r.map(op.outputs[0], b.reshape(copy, c.info(op.outputs[0]).shape));
      }
      continue;
    }
    r.copy(op);
  }
  Circuit absorbed = r.finish(outputs);
  return dce(absorbed, outputs);  // the reshapes only the casts read
}

}  // namespace

Circuit absorb_casts(const Circuit& c, std::vector<ValueId>& outputs) {
  Circuit rows_and_matmuls = absorb_row_and_matmul_casts(c, outputs);
  return absorb_attention_casts(rows_and_matmuls, outputs);
}

}  // namespace kiln
