// User Prims and custom VJPs: the registry's checks on a spec, the PrimDef made of it, and the
// tracing of a Tensor-level VJP rule into the Circuit the reverse sweep is building.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>
#include <utility>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/user_prim.hpp>

namespace kiln {

namespace {

std::string location(const SourceLocation& where) {
  return std::filesystem::path(where.file).filename().string() + ":" + std::to_string(where.line);
}

void check_name(const std::string& name, const std::string& at) {
  const bool ok = !name.empty() && (std::islower(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
                  std::all_of(name.begin(), name.end(), [](char ch) {
                    return std::islower(static_cast<unsigned char>(ch)) ||
                           std::isdigit(static_cast<unsigned char>(ch)) || ch == '_';
                  });
  if (!ok)
    throw Error("register_prim: the name '" + name + "' (registered at " + at +
                ") must be lower case letters, digits and '_', starting with a letter or '_'");
  if (name == "user")
    throw Error("register_prim: the name 'user' (registered at " + at + ") is the id every user Prim shares");
}

// Traces fn over tensors standing for `args` (values of b's circuit; kNoValue: an undefined
// Tensor) in a recording of its own, appends the ops it recorded to b's circuit under b's scope,
// and returns its results as values of b's circuit (kNoValue for an undefined result). `what`
// names fn in errors ("the VJP rule of Prim 'softcap'").
//
// The engine's pending recording is set aside meanwhile. b's circuit may be that recording's
// (Engine::backward): a Circuit keeps its values and ops where they are when it is moved, so b
// reaches it again once it is put back; infos are read before it is set aside.
std::vector<ValueId> trace_into(Builder& b, const std::string& what, const std::vector<ValueId>& args,
                                const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn) {
  std::vector<ValueInfo> infos;
  for (ValueId v : args) infos.push_back(v == kNoValue ? ValueInfo{} : b.info(v));
  Engine& e = Engine::current();
  Engine::Recording outer = e.take_recording();
  Engine::Recording traced;
  std::vector<ValueId> result_ids;
  std::vector<ValueId> placeholder_ids;
  try {
    std::vector<Tensor> placeholders;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i] == kNoValue) {
        placeholders.emplace_back();
        placeholder_ids.push_back(kNoValue);
        continue;
      }
      placeholders.push_back(e.placeholder(infos[i], "argument " + std::to_string(i), what));
      placeholder_ids.push_back(e.value_of(placeholders.back()));
    }
    std::vector<Tensor> results;
    try {
      results = fn(placeholders);
    } catch (const Error& err) {
      throw Error(what +
                  " failed while it was traced (it may record Tensor operations on its arguments only): " + err.what());
    }
    for (size_t k = 0; k < results.size(); ++k) {
      if (!results[k].defined()) {
        result_ids.push_back(kNoValue);
        continue;
      }
      try {
        result_ids.push_back(e.value_of(results[k]));
      } catch (const Error& err) {
        throw Error(what + ": result " + std::to_string(k) + " is not a tensor it recorded: " + err.what());
      }
    }
    traced = e.take_recording();
    e.restore_recording(std::move(outer));
  } catch (...) {
    e.restore_recording(std::move(outer));
    throw;
  }

  // Splice: placeholders are the arguments; any other external is a value fn may not read.
  const Circuit& t = traced.circuit;
  std::vector<ValueId> map(t.num_values(), kNoValue);
  for (size_t i = 0; i < args.size(); ++i)
    if (placeholder_ids[i] != kNoValue) map[static_cast<size_t>(placeholder_ids[i])] = args[i];
  // Checked before anything is appended: a refused rule leaves b's circuit as it was.
  auto foreign = [&](ValueId v) { return t.value(v).producer < 0 && map[static_cast<size_t>(v)] == kNoValue; };
  auto refuse = [&](ValueId v, const std::string& use) {
    const Value& x = t.value(v);
    throw Error(what + " " + use + " " +
                (x.role == ValueRole::Persistent ? "the parameter or state '" : "the tensor '") + x.name + "' " +
                dtype_name(x.info.dtype) + x.info.shape.str() +
                ", which is not one of its arguments: it may read only its arguments and constants it records "
                "(Tensor::full), no parameter, host tensor, scalar input or random draw");
  };
  for (const Op& op : t.ops())
    for (ValueId in : op.inputs)
      if (foreign(in)) refuse(in, "reads");
  for (ValueId r : result_ids)
    if (r != kNoValue && foreign(r)) refuse(r, "returns");
  for (const Op& op : t.ops()) {
    std::vector<ValueId> inputs;
    for (ValueId in : op.inputs) inputs.push_back(map[static_cast<size_t>(in)]);
    const std::vector<ValueId> outs = b.circuit().add_op(*op.prim, op.params, inputs, b.scope());
    for (size_t k = 0; k < outs.size(); ++k) map[static_cast<size_t>(op.outputs[k])] = outs[k];
  }
  std::vector<ValueId> out;
  for (ValueId r : result_ids) out.push_back(r == kNoValue ? kNoValue : map[static_cast<size_t>(r)]);
  return out;
}

// A Tensor-level VJP rule as the reverse sweep calls it: the op's values in, one gradient per
// input out, each checked against its input's dtype and count.
VjpRule traced_vjp(const std::string& prim,
                   const std::function<std::vector<Tensor>(const Op& op, const std::vector<Tensor>& args)>& rule) {
  return [prim, rule](Builder& b, const Op& op, const std::vector<ValueId>& g) {
    // The op is copied: the ops the rule appends may move the circuit's op list.
    const Op copy = op;
    std::vector<ValueId> args = copy.inputs;
    args.insert(args.end(), copy.outputs.begin(), copy.outputs.end());
    args.insert(args.end(), g.begin(), g.end());
    const std::string what = "the VJP rule of Prim '" + prim + "'";
    std::vector<DType> dtypes;
    for (ValueId in : copy.inputs) dtypes.push_back(b.info(in).dtype);
    std::vector<ValueId> grads = trace_into(b, what, args, [&](const std::vector<Tensor>& t) { return rule(copy, t); });
    if (grads.size() != copy.inputs.size())
      throw Error(what + " returned " + std::to_string(grads.size()) + " gradients for " +
                  std::to_string(copy.inputs.size()) + " inputs (one per input; an undefined Tensor for none)");
    for (size_t k = 0; k < grads.size(); ++k)
      if (grads[k] != kNoValue && b.info(grads[k]).dtype != gradient_dtype(dtypes[k]))
        throw Error(what + " returned a " + dtype_name(b.info(grads[k]).dtype) + b.info(grads[k]).shape.str() +
                    " gradient for input " + std::to_string(k) + " of " + dtype_name(dtypes[k]) +
                    ", whose gradients are " + dtype_name(gradient_dtype(dtypes[k])));
    return grads;
  };
}

// Splits the traced arguments (inputs, outputs, output gradients) back into their three lists.
void split_args(const Op& op, const std::vector<Tensor>& t, std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
                std::vector<Tensor>& grads) {
  const auto ni = static_cast<std::ptrdiff_t>(op.inputs.size()), no = static_cast<std::ptrdiff_t>(op.outputs.size());
  inputs.assign(t.begin(), t.begin() + ni);
  outputs.assign(t.begin() + ni, t.begin() + ni + no);
  grads.assign(t.begin() + ni + no, t.end());
}

}  // namespace

std::vector<Tensor> UserPrim::apply(const std::vector<Tensor>& inputs, Params params) const {
  Engine& e = Engine::current();
  std::vector<ValueId> ids;
  for (const Tensor& t : inputs) ids.push_back(e.value_of(t));
  Builder b = e.builder();
  const std::vector<ValueId> outs = b.circuit().add_op(*def_, std::move(params), ids, b.scope());
  std::vector<Tensor> r;
  for (ValueId v : outs) r.push_back(e.wrap(v));
  return r;
}

Tensor UserPrim::operator()(const std::vector<Tensor>& inputs, Params params) const {
  std::vector<Tensor> r = apply(inputs, std::move(params));
  if (r.size() != 1)
    throw Error("Prim '" + name() + "' has " + std::to_string(r.size()) + " outputs: call apply() for all of them");
  return r[0];
}

UserPrim register_prim(UserPrimSpec spec, SourceLocation where) {
  const std::string at = location(where);
  check_name(spec.name, at);
  auto missing = [&](const char* piece) {
    throw Error("register_prim: Prim '" + spec.name + "' (registered at " + at + ") has no " + piece);
  };
  if (!spec.shape) missing("shape rule");
  if (!spec.reference) missing("CPU reference");
  if (!spec.vjp) missing("VJP rule (a Prim no gradient flows through returns undefined Tensors from it)");
  if (std::find(spec.dtypes.begin(), spec.dtypes.end(), DType::f64) == spec.dtypes.end())
    missing("f64 in its dtypes (the gradient check runs in f64)");
  if (int{static_cast<bool>(spec.pointwise_body)} + int{static_cast<bool>(spec.row_body)} +
          int{static_cast<bool>(spec.gpu_kernel)} >
      1)
    throw Error("register_prim: Prim '" + spec.name + "' (registered at " + at +
                ") has more than one GPU lowering (pointwise_body, row_body, gpu_kernel): give one");
  for (DType t : spec.dtypes)
    if (!is_float(t))
      throw Error("register_prim: Prim '" + spec.name + "' (registered at " + at + ") lists " + dtype_name(t) +
                  " among its dtypes, which are the float dtypes its reference runs");

  PrimDef d;
  d.name = spec.name;
  d.family = "user: " + at;
  d.registered_at = at;
  d.nondiff_inputs = spec.nondiff_inputs;
  d.describe = spec.describe;
  d.pointwise_body = spec.pointwise_body;
  d.gpu_kernel = static_cast<bool>(spec.gpu_kernel);
  if (spec.row_body)
    d.row_body = [row_body = spec.row_body](const std::vector<ValueInfo>& in, const Params& p) {
      const auto floating = std::find_if(in.begin(), in.end(), [](const ValueInfo& i) { return is_float(i.dtype); });
      return row_body(in, p).to_params(floating == in.end() ? DType::f32 : floating->dtype);
    };
  d.ref_f32 = std::find(spec.dtypes.begin(), spec.dtypes.end(), DType::f32) != spec.dtypes.end();
  d.ref_f64 = true;
  d.shape = [dtypes = spec.dtypes, rule = spec.shape](const ShapeCtx& ctx, const std::vector<ValueInfo>& in,
                                                      const Params& p) {
    for (size_t k = 0; k < in.size(); ++k)
      if (is_float(in[k].dtype) && std::find(dtypes.begin(), dtypes.end(), in[k].dtype) == dtypes.end()) {
        std::string runs;
        for (DType t : dtypes) runs += std::string(runs.empty() ? "" : ", ") + dtype_name(t);
        ctx.fail("runs on " + runs + "; input " + std::to_string(k) + " is " + dtype_name(in[k].dtype) +
                 in[k].shape.str());
      }
    return rule(ctx, in, p);
  };
  d.eval = [reference = spec.reference](const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
    std::vector<HostTensor> outs;
    for (size_t k = 0; k < bufs.infos().size(); ++k) outs.push_back(bufs.output(k));
    reference(PrimCall{in, outs, op.params});
    return outs;
  };
  d.vjp = traced_vjp(spec.name, [vjp = spec.vjp](const Op& op, const std::vector<Tensor>& t) {
    VjpArgs a{{}, {}, {}, op.params};
    split_args(op, t, a.inputs, a.outputs, a.out_grads);
    return vjp(a);
  });
  const PrimDef& def = PrimRegistry::instance().add_user(std::move(d));
  if (spec.gpu_kernel) cuda::register_user_lowering(def, spec.gpu_kernel);
  return UserPrim(def);
}

namespace {

// The Prim of a custom VJP: output 0 is input 0 (the forward's value), the other inputs are the
// forward's arguments, and the VJP rule is the user's backward on them.
UserPrim register_custom_vjp(const std::string& name, bool has_forward, CustomVjp::Backward backward,
                             const SourceLocation& where) {
  const std::string at = location(where);
  check_name(name, at);
  if (!has_forward) throw Error("CustomVjp: '" + name + "' (registered at " + at + ") has no forward");
  if (!backward) throw Error("CustomVjp: '" + name + "' (registered at " + at + ") has no backward");
  PrimDef d;
  d.name = name;
  d.family = "user: " + at;
  d.registered_at = at;
  d.forwards_input0 = true;
  d.output_aliases = 0;
  d.nondiff_inputs = {0};
  d.shape = [](const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params&) {
    if (in.size() < 2) ctx.fail("a custom VJP takes its forward's value and at least one argument");
    return std::vector<ValueInfo>{in[0]};
  };
  d.eval = [](const Op&, const std::vector<const HostTensor*>& in, EvalBuffers&) {
    return std::vector<HostTensor>{*in[0]};  // values are immutable: share the storage
  };
  d.vjp = traced_vjp(name, [name, backward = std::move(backward)](const Op& op, const std::vector<Tensor>& t) {
    std::vector<Tensor> inputs, outputs, grads;
    split_args(op, t, inputs, outputs, grads);
    CustomVjpArgs a{std::vector<Tensor>(inputs.begin() + 1, inputs.end()), outputs[0], grads[0]};
    std::vector<Tensor> r = backward(a);
    if (r.size() != a.inputs.size())
      throw Error("the backward of CustomVjp '" + name + "' returned " + std::to_string(r.size()) + " gradients for " +
                  std::to_string(a.inputs.size()) + " inputs (one per input; an undefined Tensor for none)");
    r.insert(r.begin(), Tensor());  // the forward's value gets none: its ops are not differentiated
    return r;
  });
  return UserPrim(PrimRegistry::instance().add_user(std::move(d)));
}

}  // namespace

CustomVjp::CustomVjp(std::string name, Forward forward, Backward backward, SourceLocation where)
    : forward_(std::move(forward)), prim_(register_custom_vjp(name, forward_ != nullptr, std::move(backward), where)) {}

Tensor CustomVjp::operator()(const std::vector<Tensor>& inputs) const {
  std::vector<Tensor> args{forward_(inputs)};
  args.insert(args.end(), inputs.begin(), inputs.end());
  return prim_(args);
}

}  // namespace kiln
