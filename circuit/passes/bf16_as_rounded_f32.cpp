// bf16_as_rounded_f32 (bf16_as_rounded_f32.hpp): bf16 operands held in f32, rounded to bf16, on the CPU.
#include <algorithm>

#include <kiln/circuit/passes/bf16_as_rounded_f32.hpp>
#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/prims/builder.hpp>

namespace kiln {

namespace {

// Ops that move values without computing on them: their f32 forms move the same rounded values.
bool moves_values(const Op& op) {
  return op.is(PrimId::reshape) || op.is(PrimId::permute) || op.is(PrimId::broadcast) || op.is(PrimId::slice) ||
         op.is(PrimId::concat) || op.is(PrimId::split) || op.is(PrimId::stop_gradient) || op.is(PrimId::gather_rows);
}

}  // namespace

Circuit bf16_as_rounded_f32(const Circuit& c, std::vector<ValueId>& outputs, const Target& target) {
  if (target.gpu() || target.cpu_bf16 != CpuBf16Products::rounded_f32) return c;
  const auto is_bf16 = [&](ValueId v) { return c.info(v).dtype == DType::bf16; };
  if (std::none_of(c.ops().begin(), c.ops().end(),
                   [&](const Op& op) { return std::any_of(op.outputs.begin(), op.outputs.end(), is_bf16); }))
    return c;

  Rebuild r(c);
  // A bf16 value of c in the result: its f32 form (rounded to bf16) and its bf16 form, each made
  // from the other (exactly) the first time a reader asks for it.
  std::vector<ValueId> as_f32(c.num_values(), kNoValue), as_bf16(c.num_values(), kNoValue);
  for (ValueId x : c.externals())
    if (is_bf16(x)) as_bf16[static_cast<size_t>(x)] = r.at(x);
  auto f32_of = [&](Builder& b, ValueId v) {
    ValueId& f = as_f32[static_cast<size_t>(v)];
    if (f == kNoValue) f = b.cast(as_bf16[static_cast<size_t>(v)], DType::f32);
    return f;
  };
  auto bf16_of = [&](Builder& b, ValueId v) {
    ValueId& h = as_bf16[static_cast<size_t>(v)];
    if (h == kNoValue) h = b.cast(as_f32[static_cast<size_t>(v)], DType::bf16);
    return h;
  };

  for (const Op& op : c.ops()) {
    const bool reads_bf16 = std::any_of(op.inputs.begin(), op.inputs.end(), is_bf16);
    const bool writes_bf16 = std::any_of(op.outputs.begin(), op.outputs.end(), is_bf16);
    if (!reads_bf16 && !writes_bf16) {
      r.copy(op);
      continue;
    }
    r.out().set_recording_phase(op.phase);
    Builder b(r.out(), op.scope);
    if (op.is(PrimId::cast)) {
      const ValueId x = op.inputs[0], y = op.outputs[0];
      const DType from = c.info(x).dtype, to = op.params.dtype;
      if (to == DType::bf16 && from == DType::f32)
        as_f32[static_cast<size_t>(y)] = b.pointwise(se::round_bf16(se::in(0)), {r.at(x)});
      else if (to == DType::bf16 && from == DType::bf16)
        as_f32[static_cast<size_t>(y)] = f32_of(b, x);
      else if (to == DType::bf16)  // from f64 or an integer: one rounding, as the cast does
        as_bf16[static_cast<size_t>(y)] = b.cast(r.at(x), DType::bf16);
      else  // from bf16: every bf16 value is exact in f32 and wider types
        r.map(y, to == DType::f32 ? f32_of(b, x) : b.cast(f32_of(b, x), to));
      continue;
    }
    const bool rewritten = op.is(PrimId::matmul) || moves_values(op);
    std::vector<ValueId> inputs;
    for (ValueId x : op.inputs) inputs.push_back(!is_bf16(x) ? r.at(x) : rewritten ? f32_of(b, x) : bf16_of(b, x));
    const std::vector<ValueId> outs = r.emit(op, op.params, inputs);
    for (size_t k = 0; k < outs.size(); ++k) {
      const ValueId y = op.outputs[k];
      if (!is_bf16(y))
        r.map(y, outs[k]);
      else
        (rewritten ? as_f32 : as_bf16)[static_cast<size_t>(y)] = outs[k];
    }
  }
  for (ValueId o : outputs)
    if (is_bf16(o)) {
      const int32_t producer = c.value(o).producer;
      if (producer >= 0) r.out().set_recording_phase(c.ops()[static_cast<size_t>(producer)].phase);
      Builder b(r.out(), producer >= 0 ? c.ops()[static_cast<size_t>(producer)].scope : std::string());
      r.map(o, bf16_of(b, o));
    }
  return r.finish(outputs);
}

}  // namespace kiln
