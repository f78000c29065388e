// Module: parameter registry, dotted names, train/eval, dtype conversion.
#include <algorithm>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/layers/module.hpp>

namespace kiln::nn {

void Module::check_new_name(const std::string& kind, const std::string& name) const {
  const std::string where = path_.empty() ? "" : " in module '" + path_ + "'";
  auto fail = [&](const std::string& why) { throw Error(kind + " name '" + name + "'" + where + ": " + why); };
  if (name.empty()) fail("names must not be empty");
  if (name.find('.') != std::string::npos) fail("names must not contain '.' (it separates the parts of a path)");
  for (const auto& [n, p] : params_)
    if (n == name) fail("a parameter of this name is already registered");
  for (const auto& [n, c] : children_)
    if (n == name) fail("a module of this name is already registered");
}

Tensor Module::register_parameter(const std::string& name, const HostTensor& init, bool requires_grad) {
  check_new_name("parameter", name);
  Tensor p = Tensor::parameter(name, init, requires_grad);
  params_.emplace_back(name, p);
  return p;
}

Tensor Module::register_parameter(const std::string& name, const Tensor& existing) {
  if (!existing.is_persistent()) throw Error("register_parameter('" + name + "'): not a parameter");
  check_new_name("parameter", name);
  params_.emplace_back(name, existing);
  return existing;
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out,
                     std::vector<const TensorImpl*>& seen) const {
  for (const auto& [name, p] : params_) {
    if (std::find(seen.begin(), seen.end(), p.impl().get()) != seen.end()) continue;
    seen.push_back(p.impl().get());
    out.emplace_back(prefix + name, p);
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect("", out, seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

Tensor Module::parameter(const std::string& path) const {
  for (auto& [name, p] : named_parameters())
    if (name == path) return p;
  throw Error("no parameter named '" + path + "'");
}

size_t Module::num_parameters() const {
  size_t n = 0;
  for (auto& [name, p] : named_parameters()) n += static_cast<size_t>(p.numel());
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(DType dtype) {
  for (auto& [name, p] : named_parameters()) Engine::current().convert_persistent(p.impl(), dtype);
}

void Module::zero_grad() {
  for (auto& [name, p] : named_parameters())
    if (p.requires_grad()) p.grad().assign(Tensor::zeros(p.shape(), p.dtype()));
  Engine::current().realize();
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (auto& [name, child] : children_) child->set_path(join(path_, name));
}

std::optional<Scope> Module::scope() const {
  if (path_.empty()) return std::nullopt;
  return std::optional<Scope>(std::in_place, path_, /*absolute=*/true);
}

namespace {
thread_local bool empty_parameters = false;
}

EmptyParameters::EmptyParameters() : previous_(empty_parameters) { empty_parameters = true; }
EmptyParameters::~EmptyParameters() { empty_parameters = previous_; }
bool EmptyParameters::active() { return empty_parameters; }

HostTensor normal_init(const Shape& shape, double std, DType dtype) {
  if (empty_parameters) return HostTensor::view(dtype, shape, nullptr);
  return (Tensor::randn(shape, dtype) * std).to_host();
}

HostTensor constant_init(const Shape& shape, double value, DType dtype) {
  if (empty_parameters) return HostTensor::view(dtype, shape, nullptr);
  HostTensor t = HostTensor::zeros(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
  return t;
}

}  // namespace kiln::nn
