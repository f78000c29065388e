// Module: the base of every layer, in the libtorch manner. A module owns named parameters
// (persistent tensors) and named child modules; named_parameters() lists every parameter once
// under its dotted path ("transformer.h.0.attn.c_attn.weight"), a module's own parameters
// before its children's (as PyTorch), so a tied parameter appears once, under its first name.
// forward code runs inside scope(), so the ops it records (and their errors) carry the module's
// whole path from the root it is registered under ("model.layers.1.input_layernorm").
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <kiln/core/engine.hpp>
#include <kiln/core/tensor.hpp>

namespace kiln::nn {

class Module {
 public:
  virtual ~Module() = default;

  // Registers `init` as a new parameter under `name` and returns it.
  Tensor register_parameter(const std::string& name, const HostTensor& init, bool requires_grad = true);
  // Registers an existing parameter under another name too (weight tying).
  Tensor register_parameter(const std::string& name, const Tensor& existing);
  // Names are one path component: not empty, no '.', unique among a module's parameters and
  // children (kiln::Error otherwise, naming the module).
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_new_name("module", name);
    children_.emplace_back(name, module);
    static_cast<Module&>(*module).set_path(join(path_, name));
    return module;
  }

  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // The parameter at a dotted path; throws kiln::Error naming the path if there is none.
  Tensor parameter(const std::string& path) const;
  size_t num_parameters() const;  // elements, each parameter counted once

  // The dotted path from the root module it is registered under ("model.layers.1"; "" for a
  // root), the prefix of its parameters' names.
  const std::string& path() const { return path_; }

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Converts every parameter (and its gradient buffer) to dtype; f64 for gradient checks.
  void to(DType dtype);
  // Sets every parameter's gradient buffer to zero (for accumulation across steps).
  void zero_grad();

 protected:
  // RAII scope carrying this module's path while its forward records ops (none for a module
  // registered nowhere, such as a model's root).
  std::optional<Scope> scope() const;

 private:
  void check_new_name(const std::string& kind, const std::string& name) const;
  // Sets this module's path and its descendants': registration happens bottom-up (a module's
  // children are registered in its constructor, before it is registered itself).
  void set_path(const std::string& path);
  static std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; }
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out,
               std::vector<const TensorImpl*>& seen) const;
  std::string path_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// A host tensor of N(0, std^2) values from kiln's Philox stream (the engine's seed), realized.
// A list of modules of one type, named 0, 1, ... in order (PyTorch's nn.ModuleList): a model
// that registers one as "layers" names its parameters "layers.0.weight", "layers.1.weight", ...
template <class M>
class ModuleList : public Module {
 public:
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(module)));
    return items_.back();
  }
  size_t size() const { return items_.size(); }
  const std::shared_ptr<M>& operator[](size_t i) const { return items_.at(i); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

// Parameter initial values: N(0, std), or a constant. Under EmptyParameters both return no data.
HostTensor normal_init(const Shape& shape, double std, DType dtype = DType::f32);
HostTensor constant_init(const Shape& shape, double value, DType dtype = DType::f32);

// While alive, the modules this thread makes get parameters without values (PyTorch's meta
// device, accelerate's init_empty_weights): no random initialization runs, and their slots stay
// zero pages that take no memory until written. For a model whose values come from elsewhere:
// kiln import streams a checkpoint's tensors to a weights file through such a model, which
// supplies the names and shapes only. Its parameters read as zeros.
class EmptyParameters {
 public:
  EmptyParameters();
  ~EmptyParameters();
  EmptyParameters(const EmptyParameters&) = delete;
  EmptyParameters& operator=(const EmptyParameters&) = delete;
  // Whether one is alive on this thread (models skip their memory check: nothing is touched).
  static bool active();

 private:
  bool previous_;
};

}  // namespace kiln::nn
