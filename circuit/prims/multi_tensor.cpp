// Prim family `multi_tensor`: one elementwise program over several tensors of different shapes
// (see circuit/prims/multi_tensor.hpp for the program and shape contract). The merge pass that
// builds it runs after AD, so the Prim has no VJP rule. Reference: each group is evaluated as
// the pointwise (or pointwise + reduce_all) ops it replaces would be.
#include <spdlog/fmt/fmt.h>

#include <kiln/circuit/ir/prim.hpp>
#include <kiln/circuit/prims/body_eval.hpp>
#include <kiln/circuit/prims/families.hpp>
#include <kiln/circuit/prims/multi_tensor.hpp>

namespace kiln {

bool MultiTensorProgram::reads(int j) const {
  for (const ScalarExp& e : bodies)
    if (e.depends_on(j)) return true;
  return false;
}

Params MultiTensorProgram::to_params(DType dtype) const {
  Params p;
  p.dtype = dtype;
  p.ints = {groups, group_inputs, shared_inputs, sum ? 1 : 0, has_total ? 1 : 0};
  p.bodies = bodies;
  if (has_total) p.bodies.push_back(total);
  return p;
}

MultiTensorProgram MultiTensorProgram::from_params(const Params& p) {
  if (p.ints.size() != 5 || p.ints[0] < 1 || p.ints[1] < 0 || p.ints[2] < 0 ||
      p.bodies.size() < (p.ints[4] != 0 ? 2u : 1u))
    throw Error("multi_tensor: malformed params");
  MultiTensorProgram mp;
  mp.groups = static_cast<int>(p.ints[0]);
  mp.group_inputs = static_cast<int>(p.ints[1]);
  mp.shared_inputs = static_cast<int>(p.ints[2]);
  mp.sum = p.ints[3] != 0;
  mp.bodies = p.bodies;
  mp.has_total = p.ints[4] != 0;
  if (mp.has_total) {
    mp.total = mp.bodies.back();
    mp.bodies.pop_back();
  }
  return mp;
}

std::string MultiTensorProgram::describe() const {
  std::string s = fmt::format("{} groups of {} inputs, {} shared (read as in{}..){}", groups, group_inputs,
                              shared_inputs, group_inputs, sum ? ", summed" : "");
  for (size_t r = 0; r < bodies.size(); ++r) s += fmt::format(" out{}={{{}}}", r, bodies[r].str());
  if (has_total) s += fmt::format(" total={{{}}} over the group sums", total.str());
  return s;
}

Shape multi_tensor_domain(const MultiTensorProgram& mp, const std::vector<ValueInfo>& in, int g) {
  Shape domain{};
  for (int j = 0; j < mp.group_inputs; ++j) {
    const Shape& s = in[mp.input(g, j)].shape;
    if (s.numel() > domain.numel() || (s.numel() == domain.numel() && s.rank() > domain.rank())) domain = s;
  }
  return domain;
}

namespace {

std::vector<ValueInfo> shape_rule(const ShapeCtx& ctx, const std::vector<ValueInfo>& in, const Params& p) {
  MultiTensorProgram mp;
  try {
    mp = MultiTensorProgram::from_params(p);
  } catch (const Error& e) {
    ctx.fail(e.what());
  }
  const size_t expected =
      static_cast<size_t>(mp.groups) * static_cast<size_t>(mp.group_inputs) + static_cast<size_t>(mp.shared_inputs);
  if (in.size() != expected)
    ctx.fail(fmt::format("params describe {} groups of {} inputs and {} shared inputs ({} in all); {} were given",
                         mp.groups, mp.group_inputs, mp.shared_inputs, expected, in.size()));
  if (p.dtype != DType::f32 && p.dtype != DType::f64) ctx.fail("result dtype must be f32 or f64");
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k].dtype != p.dtype)
      ctx.fail(fmt::format("input {} is {}{}; every input must be {}", k, dtype_name(in[k].dtype), in[k].shape.str(),
                           dtype_name(p.dtype)));
  if (mp.sum && mp.bodies.size() != 1) ctx.fail(fmt::format("a summed program has one body, not {}", mp.bodies.size()));
  if (mp.has_total && !mp.sum) ctx.fail("a total needs a summed program");
  if (mp.has_total && mp.total.num_inputs() > mp.groups)
    ctx.fail(fmt::format("total {} reads past the {} group sums", mp.total.str(), mp.groups));
  for (const ScalarExp& e : mp.bodies)
    if (e.num_inputs() > mp.group_inputs + mp.shared_inputs)
      ctx.fail(fmt::format("body {} reads past the {} group and {} shared inputs", e.str(), mp.group_inputs,
                           mp.shared_inputs));
  for (int k = 0; k < mp.shared_inputs; ++k)
    if (in[mp.shared(k)].shape.numel() != 1)
      ctx.fail(
          fmt::format("shared input {} is {}; shared inputs must have one element", k, in[mp.shared(k)].shape.str()));
  std::vector<ValueInfo> out;
  for (int g = 0; g < mp.groups; ++g) {
    const Shape domain = multi_tensor_domain(mp, in, g);
    for (int j = 0; j < mp.group_inputs; ++j) {
      const Shape& s = in[mp.input(g, j)].shape;
      if (s != domain && !(s.numel() == 1 && s.rank() <= domain.rank()))
        ctx.fail(fmt::format("group {} input {} is {}; it must be the group's domain {} or a scalar", g, j, s.str(),
                             domain.str()));
    }
    for (size_t r = 0; r < mp.bodies.size(); ++r) out.push_back({mp.sum ? Shape{} : domain, p.dtype});
  }
  if (mp.has_total) return {{Shape{}, p.dtype}};
  return out;
}

std::vector<HostTensor> eval(const Op& op, const std::vector<const HostTensor*>& in, EvalBuffers& bufs) {
  const MultiTensorProgram mp = MultiTensorProgram::from_params(op.params);
  std::vector<ValueInfo> infos;
  for (const HostTensor* x : in) infos.push_back({x->shape(), x->dtype()});
  std::vector<HostTensor> outs;
  if (mp.has_total) {  // the group sums first, then the total over them
    for (int g = 0; g < mp.groups; ++g) outs.push_back(bufs.scratch(op.params.dtype, Shape{}));
  } else {
    for (size_t k = 0; k < bufs.size(); ++k) outs.push_back(bufs.output(k));
  }
  ref::dispatch_float(op.params.dtype, "multi_tensor", [&](auto t) {
    using T = decltype(t);
    for (int g = 0; g < mp.groups; ++g) {
      const Shape domain = multi_tensor_domain(mp, infos, g);
      std::vector<const HostTensor*> operands;
      for (int j = 0; j < mp.group_inputs; ++j) operands.push_back(in[mp.input(g, j)]);
      for (int k = 0; k < mp.shared_inputs; ++k) operands.push_back(in[mp.shared(k)]);
      for (size_t r = 0; r < mp.bodies.size(); ++r) {
        // A sum is taken over the whole evaluated body, as reduce_all would take it (so that
        // merging changes no bit of the result on the CPU).
        HostTensor values = mp.sum ? bufs.scratch(op.params.dtype, domain) : HostTensor();
        HostTensor& out = outs[mp.output(g, static_cast<int>(r))];
        ref::run_all(ref::BodyRunner<T>(mp.bodies[r], operands, domain),
                     mp.sum ? values.template data<T>() : out.template data<T>(), domain.numel());
        if (mp.sum) out.template data<T>()[0] = ref::array_of<T>(values).sum();
      }
    }
    if (mp.has_total) {
      std::vector<const HostTensor*> sums;
      for (const HostTensor& s : outs) sums.push_back(&s);
      HostTensor total = bufs.output(0);
      ref::run_all(ref::BodyRunner<T>(mp.total, sums, Shape{}), total.template data<T>(), 1);
      outs = {std::move(total)};
    }
  });
  return outs;
}

}  // namespace

void register_multi_tensor(PrimRegistry& r) {
  PrimDef d;
  d.id = PrimId::multi_tensor;
  d.shape = shape_rule;
  d.eval = eval;
  d.describe = [](const Params& p) { return MultiTensorProgram::from_params(p).describe(); };
  r.add(std::move(d), __FILE__);
}

}  // namespace kiln
