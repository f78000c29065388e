// The user-facing gradient check: records a function of Tensors in isolation and compares its
// reverse-mode gradients with central differences in f64 (see ad/gradcheck.hpp for the
// metric). Inputs are given as host tensors and converted to f64.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <kiln/ad/gradcheck.hpp>
#include <kiln/core/tensor.hpp>

namespace kiln {

// Checks d f / d inputs, and with check_parameters also d f / d every f64 parameter that f
// reads (layers converted with Module::to(DType::f64)). Parameters are perturbed on copies;
// their buffers are left as they were.
ad::GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<HostTensor>& inputs, const ad::GradCheckOptions& opts = {},
                              bool check_parameters = false);
// Checks d f / d inputs and d f / d each of `parameters` (a model's named_parameters(), all
// f64), reported under their names: "model.layers.0.self_attn.q_proj.weight".
ad::GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<HostTensor>& inputs,
                              const std::vector<std::pair<std::string, Tensor>>& parameters,
                              const ad::GradCheckOptions& opts = {});

}  // namespace kiln
