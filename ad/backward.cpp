// Reverse-mode sweep over a Circuit (see backward.hpp).
#include <algorithm>

#include <kiln/ad/backward.hpp>
#include <kiln/circuit/ir/error.hpp>

namespace kiln::ad {

ValueId fit_to_shape(Builder& b, ValueId g, const Shape& shape) {
  Shape gs = b.info(g).shape;
  if (gs == shape) return g;
  // Sum away leading axes the input does not have (viewed as one axis: one reduction, one
  // kernel), then axes where it has a 1.
  const int extra = gs.rank() - shape.rank();
  if (extra > 0) {
    int64_t lead = 1;
    for (int a = 0; a < extra; ++a) lead *= gs[a];
    std::vector<int64_t> rest(gs.dims().begin() + extra, gs.dims().end()), flat{lead};
    flat.insert(flat.end(), rest.begin(), rest.end());
    if (extra > 1) g = b.reshape(g, Shape(flat));
    g = b.reshape(b.reduce(ReduceKind::Sum, g, 0), Shape(rest));
  }
  for (int a = 0; a < shape.rank() && a < b.info(g).shape.rank(); ++a)
    if (shape[a] == 1 && b.info(g).shape[a] != 1) g = b.reduce(ReduceKind::Sum, g, a);
  if (b.info(g).shape != shape) g = b.broadcast(g, shape);
  return g;
}

std::vector<ValueId> backward(Builder& b, ValueId output, const std::vector<ValueId>& wrt, ValueId seed) {
  Circuit& c = b.circuit();
  const ValueInfo out_info = c.info(output);
  if (out_info.dtype != DType::f32 && out_info.dtype != DType::f64)
    fail("backward", b.scope(),
         std::string("can only differentiate a float value, received ") + dtype_name(out_info.dtype) +
             out_info.shape.str());
  // Forward pass over the recorded ops: which values depend on some wrt value.
  const size_t n_ops = c.ops().size();
  std::vector<char> needs(c.num_values(), 0);
  for (ValueId w : wrt) needs[static_cast<size_t>(w)] = 1;
  for (size_t i = 0; i < n_ops; ++i) {
    const Op& op = c.ops()[i];
    bool any = false;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      bool nondiff = std::find(op.prim->nondiff_inputs.begin(), op.prim->nondiff_inputs.end(), static_cast<int>(k)) !=
                     op.prim->nondiff_inputs.end();
      any = any || (!nondiff && needs[static_cast<size_t>(op.inputs[k])]);
    }
    // A computed value in wrt keeps its mark: its gradient is wanted whatever it depends on.
    for (ValueId o : op.outputs) {
      char& n = needs[static_cast<size_t>(o)];
      n = n || (any && is_float(c.info(o).dtype));
    }
  }

  std::vector<ValueId> grad(c.num_values(), kNoValue);
  if (seed == kNoValue) seed = b.fill(out_info.shape, out_info.dtype, 1.0);
  if (!(c.info(seed) == out_info))
    fail("backward", b.scope(),
         "seed gradient must match the output: expected " + std::string(dtype_name(out_info.dtype)) +
             out_info.shape.str() + ", received " + dtype_name(c.info(seed).dtype) + c.info(seed).shape.str());
  grad[static_cast<size_t>(output)] = seed;

  for (size_t i = n_ops; i-- > 0;) {
    const Op op = c.ops()[i];  // a copy: VJP rules append to c.ops()
    std::vector<ValueId> out_grads;
    bool any = false;
    for (ValueId o : op.outputs) {
      out_grads.push_back(needs[static_cast<size_t>(o)] ? grad[static_cast<size_t>(o)] : kNoValue);
      any = any || out_grads.back() != kNoValue;
    }
    if (!any) continue;
    if (!op.prim->vjp) fail(op.prim->name, op.scope, "no VJP rule for Prim '" + op.prim->name + "'");
    Builder rule_builder(c, op.scope);
    std::vector<ValueId> in_grads = op.prim->vjp(rule_builder, op, out_grads);
    if (in_grads.size() != op.inputs.size())
      fail(op.prim->name, op.scope,
           "VJP rule returned " + std::to_string(in_grads.size()) + " gradients for " +
               std::to_string(op.inputs.size()) + " inputs");
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      ValueId x = op.inputs[k];
      if (in_grads[k] == kNoValue || !needs[static_cast<size_t>(x)]) continue;
      ValueId g = fit_to_shape(rule_builder, in_grads[k], c.info(x).shape);
      if (c.info(g).dtype != gradient_dtype(c.info(x).dtype))
        fail(op.prim->name, op.scope,
             "VJP rule returned a gradient of dtype " + std::string(dtype_name(c.info(g).dtype)) +
                 " for an input of dtype " + dtype_name(c.info(x).dtype) + " (expected " +
                 dtype_name(gradient_dtype(c.info(x).dtype)) + ")");
      ValueId& acc = grad[static_cast<size_t>(x)];
      acc = acc == kNoValue ? g : rule_builder.add(acc, g);
    }
  }
  std::vector<ValueId> result;
  for (ValueId w : wrt) result.push_back(grad[static_cast<size_t>(w)]);
  return result;
}

}  // namespace kiln::ad
