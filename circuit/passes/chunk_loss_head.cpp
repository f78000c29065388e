// chunk_loss_head (chunk_loss_head.hpp): the head, loss and head's backward products chunk by
// chunk of sequences.
#include <algorithm>
#include <map>
#include <optional>

#include <kiln/circuit/passes/chunk_loss_head.hpp>
#include <kiln/circuit/passes/cleanup.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

namespace {

bool is_matmul(const Op& op, bool ta, bool tb) {
  if (!op.is(PrimId::matmul)) return false;
  const MatmulParams m = MatmulParams::of(op);
  return m.transpose_a == ta && m.transpose_b == tb;
}

// Whether op computes each sequence of its output (leading axis `batch`) from that sequence of
// its inputs alone.
bool separable(const Circuit& c, const Op& op, int64_t batch) {
  if (op.outputs.size() != 1) return false;
  const Shape& out = c.info(op.outputs[0]).shape;
  if (out.rank() < 2 || out[0] != batch) return false;
  if (op.is(PrimId::pointwise) || op.is(PrimId::cast) || op.is(PrimId::stop_gradient) || op.is(PrimId::gather_last))
    return true;
  if (op.is(PrimId::reduce)) {
    const int rank = c.info(op.inputs[0]).shape.rank();
    const int axis = ReduceParams::of(op).axis;
    return (axis < 0 ? axis + rank : axis) != 0;
  }
  if (op.is(PrimId::broadcast) || op.is(PrimId::reshape)) {
    // A broadcast aligns shapes from the right: only one of the output's rank keeps B at axis 0.
    const Shape& in = c.info(op.inputs[0]).shape;
    return in.rank() >= 1 && in[0] == batch && (op.is(PrimId::reshape) || in.rank() == out.rank());
  }
  return false;
}

// Whether a chunk reads input k of op (not a value of the region) as a slice of its sequences
// rather than whole: it has the leading batch axis where the op's output has it (a pointwise
// operand of lower rank or a leading 1 broadcasts instead).
bool sliced(const Circuit& c, const Op& op, size_t k, int64_t batch) {
  const Shape& in = c.info(op.inputs[k]).shape;
  if (in.rank() < 1 || in[0] != batch) return false;
  return !op.is(PrimId::pointwise) || in.rank() == c.info(op.outputs[0]).shape.rank();
}

// One occurrence: the head's product, the region S, the two backward products.
struct Region {
  int32_t head = -1, dh = -1, dw_reshape = -1, dw = -1;
  std::vector<char> in_s;     // per op
  std::vector<char> s_value;  // per value: made by the head or by S
  int64_t batch = 0, per_sequence_bytes = 0;
};

std::optional<Region> find_region(const Circuit& c, int32_t m, const std::vector<std::vector<int32_t>>& readers,
                                  const std::vector<bool>& requested, size_t max_chunk_bytes) {
  const auto& ops = c.ops();
  const Op& head = ops[static_cast<size_t>(m)];
  if (!is_matmul(head, false, true)) return std::nullopt;
  const ValueId logits = head.outputs[0], h = head.inputs[0], w = head.inputs[1];
  const ValueInfo& li = c.info(logits);
  // f32 operands only: a bf16 head's casts are not part of the pattern (untested there).
  if (li.dtype != DType::f32 || c.info(h).dtype != DType::f32 || c.info(w).dtype != DType::f32 ||
      li.shape.rank() != 3 || c.info(h).shape.rank() != 3 || c.info(w).shape.rank() != 2)
    return std::nullopt;
  Region r;
  r.head = m;
  r.batch = li.shape[0];
  r.per_sequence_bytes = static_cast<int64_t>(li.nbytes()) / std::max<int64_t>(r.batch, 1);
  if (r.batch < 2 || li.nbytes() <= max_chunk_bytes) return std::nullopt;
  r.in_s.assign(ops.size(), 0);
  r.s_value.assign(c.num_values(), 0);
  r.s_value[static_cast<size_t>(logits)] = 1;
  auto is_h_rows = [&](ValueId y) {  // reshape(h) to [B*T, C]
    const int32_t p = c.value(y).producer;
    return p >= 0 && ops[static_cast<size_t>(p)].is(PrimId::reshape) && ops[static_cast<size_t>(p)].inputs[0] == h;
  };
  std::vector<ValueId> work{logits};
  while (!work.empty()) {
    const ValueId v = work.back();
    work.pop_back();
    for (int32_t q : readers[static_cast<size_t>(v)]) {
      const Op& op = ops[static_cast<size_t>(q)];
      if (r.in_s[static_cast<size_t>(q)] || q == r.dh || q == r.dw_reshape) continue;
      if (r.dh < 0 && is_matmul(op, false, false) && op.inputs[0] == v && op.inputs[1] == w) {
        r.dh = q;
        continue;
      }
      if (r.dw < 0 && op.is(PrimId::reshape) &&
          c.info(op.outputs[0]).shape == Shape{r.batch * li.shape[1], li.shape[2]} &&
          readers[static_cast<size_t>(op.outputs[0])].size() == 1 && !requested[static_cast<size_t>(op.outputs[0])]) {
        const int32_t d = readers[static_cast<size_t>(op.outputs[0])][0];
        const Op& dw = ops[static_cast<size_t>(d)];
        if (is_matmul(dw, true, false) && dw.inputs[0] == op.outputs[0] && is_h_rows(dw.inputs[1])) {
          r.dw_reshape = q;
          r.dw = d;
          continue;
        }
      }
      // A pointwise operand of lower rank aligns with the output's last axes, not the batch's.
      const bool aligned = !op.is(PrimId::pointwise) || c.info(v).shape.rank() == c.info(op.outputs[0]).shape.rank();
      if (!aligned || !separable(c, op, r.batch)) continue;  // reads the region's values whole (the mean loss)
      r.in_s[static_cast<size_t>(q)] = 1;
      r.s_value[static_cast<size_t>(op.outputs[0])] = 1;
      work.push_back(op.outputs[0]);
    }
  }
  if (r.dh < 0 || r.dw < 0) return std::nullopt;
  // Every operand of the region's own (a second one found after the op joined) aligned too.
  for (size_t i = 0; i < ops.size(); ++i)
    if (r.in_s[i] && ops[i].is(PrimId::pointwise))
      for (ValueId v : ops[i].inputs)
        if (r.s_value[static_cast<size_t>(v)] && c.info(v).shape.rank() != c.info(ops[i].outputs[0]).shape.rank())
          return std::nullopt;
  // The producers of large inputs that only the region reads join it (the targets' one-hot
  // select, [B, T, V]), so that no input is sliced from a whole-batch tensor of that size.
  auto only_region_reads = [&](ValueId v) {
    if (requested[static_cast<size_t>(v)]) return false;
    for (int32_t q : readers[static_cast<size_t>(v)])
      if (!r.in_s[static_cast<size_t>(q)]) return false;
    return true;
  };
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = ops.size(); i-- > 0;) {
      if (!r.in_s[i]) continue;
      for (ValueId v : ops[i].inputs) {
        const int32_t p = c.value(v).producer;
        if (r.s_value[static_cast<size_t>(v)] || p < 0 || c.info(v).nbytes() <= max_chunk_bytes) continue;
        if (!separable(c, ops[static_cast<size_t>(p)], r.batch) || !only_region_reads(v)) return std::nullopt;
        r.in_s[static_cast<size_t>(p)] = 1;
        r.s_value[static_cast<size_t>(v)] = 1;
        grew = true;
      }
    }
  }
  // What the chunks read whole or concatenate (for readers and for the caller) stays small.
  for (size_t v = 0; v < c.num_values(); ++v)
    if (r.s_value[v] && requested[v] && c.info(static_cast<ValueId>(v)).nbytes() > max_chunk_bytes) return std::nullopt;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (r.in_s[i]) {
      for (size_t k = 0; k < ops[i].inputs.size(); ++k) {
        const ValueId v = ops[i].inputs[k];
        if (!r.s_value[static_cast<size_t>(v)] && c.info(v).nbytes() > max_chunk_bytes) return std::nullopt;
      }
    } else if (static_cast<int32_t>(i) != r.dh && static_cast<int32_t>(i) != r.dw_reshape) {
      for (ValueId v : ops[i].inputs)
        if (r.s_value[static_cast<size_t>(v)] && c.info(v).nbytes() > max_chunk_bytes) return std::nullopt;
    }
  }
  return r;
}

// The circuit with region `g` chunked, or nothing where an input the chunks need is made only
// after something that reads the region's results.
std::optional<Circuit> chunked(const Circuit& c, const Region& g, std::vector<ValueId>& outputs,
                               size_t max_chunk_bytes) {
  const auto& ops = c.ops();
  const Op &head = ops[static_cast<size_t>(g.head)], &dh = ops[static_cast<size_t>(g.dh)];
  const Op &dw_reshape = ops[static_cast<size_t>(g.dw_reshape)], &dw = ops[static_cast<size_t>(g.dw)];
  const ValueId h = head.inputs[0], w = head.inputs[1];
  std::vector<char> group = g.in_s;
  for (int32_t i : {g.head, g.dh, g.dw_reshape, g.dw}) group[static_cast<size_t>(i)] = 1;
  // What the chunks read whole or slice: the inputs of S, of the head and of dh (dW's product
  // reads the chunk's own slices of h).
  std::vector<ValueId> reads;
  for (size_t i = 0; i < ops.size(); ++i)
    if (g.in_s[i] || static_cast<int32_t>(i) == g.head || static_cast<int32_t>(i) == g.dh)
      for (ValueId v : ops[i].inputs)
        if (!g.s_value[static_cast<size_t>(v)]) reads.push_back(v);
  // The group goes after the last producer of what it reads.
  int32_t place = g.head;
  for (ValueId v : reads) place = std::max(place, c.value(v).producer);
  // Moving the head's work to there, and what reads it after, must not cross an assign (whose
  // old contents an op moved past it might read).
  for (int32_t i = g.head; i <= place; ++i)
    if (ops[static_cast<size_t>(i)].prim->side_effect) return std::nullopt;
  // Values of S that something else reads, or the caller: concatenated.
  std::vector<ValueId> needed;
  for (size_t i = 0; i < ops.size(); ++i)
    if (!group[i])
      for (ValueId v : ops[i].inputs)
        if (g.s_value[static_cast<size_t>(v)]) needed.push_back(v);
  for (ValueId o : outputs)
    if (g.s_value[static_cast<size_t>(o)]) needed.push_back(o);
  std::sort(needed.begin(), needed.end());
  needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
  std::vector<char> pending(c.num_values(), 0);  // made by the group, or by an op deferred after it
  for (size_t i = 0; i < ops.size(); ++i)
    if (group[i])
      for (ValueId v : ops[i].outputs) pending[static_cast<size_t>(v)] = 1;

  const Shape& ls = c.info(head.outputs[0]).shape;
  const int64_t tokens_per_sequence = ls[1], vocab = ls[2], width = c.info(h).shape[2];
  const int64_t per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(max_chunk_bytes) / std::max<int64_t>(g.per_sequence_bytes, 1));
  Rebuild r(c);
  Circuit& out = r.out();
  auto emit_group = [&]() -> bool {
    const size_t first_op = out.ops().size();
    Builder b(out, head.scope);  // appends Forward ops, as the group is tagged (below)
    for (ValueId v : reads)
      if (r.at(v) == kNoValue) return false;        // made after something that reads the region's results
    std::map<ValueId, std::vector<ValueId>> parts;  // per needed value, per chunk
    std::vector<ValueId> dh_parts;
    ValueId dw_sum = kNoValue;
    for (int64_t b0 = 0; b0 < g.batch; b0 += per_chunk) {
      const int64_t b1 = std::min(g.batch, b0 + per_chunk), rows = b1 - b0;
      std::map<ValueId, ValueId> chunk, slices;
      auto slice = [&](ValueId v) {
        auto [it, fresh] = slices.try_emplace(v, kNoValue);
        if (fresh) it->second = b.slice(r.at(v), 0, b0, b1);
        return it->second;
      };
      const ValueId hc = slice(h);
      chunk[head.outputs[0]] = r.emit(head, head.params, {hc, r.at(w)})[0];
      for (size_t i = 0; i < ops.size(); ++i) {
        if (!g.in_s[i]) continue;
        const Op& op = ops[i];
        std::vector<ValueId> inputs;
        for (size_t k = 0; k < op.inputs.size(); ++k) {
          const ValueId v = op.inputs[k];
          inputs.push_back(g.s_value[static_cast<size_t>(v)] ? chunk.at(v)
                           : sliced(c, op, k, g.batch)       ? slice(v)
                                                             : r.at(v));
        }
        Params params = op.params;
        if (op.is(PrimId::broadcast) || op.is(PrimId::reshape)) params.ints[0] = rows;  // their shape's batch
        chunk[op.outputs[0]] = r.emit(op, params, inputs)[0];
      }
      dh_parts.push_back(r.emit(dh, dh.params, {chunk.at(dh.inputs[0]), r.at(w)})[0]);
      const ValueId d2 = b.reshape(chunk.at(dw_reshape.inputs[0]), Shape{rows * tokens_per_sequence, vocab});
      const ValueId h2 = b.reshape(hc, Shape{rows * tokens_per_sequence, width});
      const ValueId part = r.emit(dw, dw.params, {d2, h2})[0];
      dw_sum = dw_sum == kNoValue ? part : b.add(dw_sum, part);
      for (ValueId v : needed) parts[v].push_back(chunk.at(v));
    }
    for (auto& [v, list] : parts) r.map(v, list.size() == 1 ? list[0] : b.concat(list, 0));
    r.map(dh.outputs[0], dh_parts.size() == 1 ? dh_parts[0] : b.concat(dh_parts, 0));
    r.map(dw.outputs[0], dw_sum);
    // All of it runs where the forward is still being made: tagged Forward, so that the recompute
    // pass (after this one) sees neither h's slices nor the chunks' values saved for a later
    // backward and leaves them alone (a copy of h would move every weight-gradient product, and
    // every chunk's gradient with it, after dh's readers).
    for (size_t i = first_op; i < out.ops().size(); ++i) out.set_phase(i, Phase::Forward);
    return true;
  };
  std::vector<int32_t> deferred;
  bool emitted = false;
  auto copy_or_defer = [&](size_t i) {
    const Op& op = ops[i];
    const bool waits = !emitted && std::any_of(op.inputs.begin(), op.inputs.end(),
                                               [&](ValueId v) { return pending[static_cast<size_t>(v)] != 0; });
    if (!waits) {
      r.copy(op);
      return;
    }
    deferred.push_back(static_cast<int32_t>(i));
    for (ValueId v : op.outputs) pending[static_cast<size_t>(v)] = 1;
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!group[i]) copy_or_defer(i);
    if (static_cast<int32_t>(i) == place) {
      if (!emit_group()) return std::nullopt;
      emitted = true;
      for (int32_t d : deferred) r.copy(ops[static_cast<size_t>(d)]);
    }
  }
  return r.finish(outputs);
}

}  // namespace

Circuit chunk_loss_head(const Circuit& c, std::vector<ValueId>& outputs, const Target& target, size_t max_chunk_bytes) {
  if (target.gpu()) return c;
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<bool> requested(c.num_values(), false);
  for (ValueId o : outputs) requested[static_cast<size_t>(o)] = true;
  for (size_t i = 0; i < c.ops().size(); ++i) {
    const std::optional<Region> g = find_region(c, static_cast<int32_t>(i), readers, requested, max_chunk_bytes);
    if (!g) continue;
    std::vector<ValueId> out = outputs;
    std::optional<Circuit> result = chunked(c, *g, out, max_chunk_bytes);
    if (!result) continue;
    outputs = out;
    // The whole batch's head, now read by nothing, goes; then the next head (a step of several
    // micro-batches has one each). A chunked head does not match again: its logits fit a chunk.
    return chunk_loss_head(dce(*result, outputs), outputs, target, max_chunk_bytes);
  }
  return c;
}

}  // namespace kiln
