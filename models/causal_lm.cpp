// CausalLM, model attributes and their checks.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/models/causal_lm.hpp>

namespace kiln::models {

void ModelAttributes::set(const std::string& name, double value) {
  for (auto& [n, v] : items_)
    if (n == name) {
      v = value;
      return;
    }
  items_.emplace_back(name, value);
}

bool ModelAttributes::has(const std::string& name) const {
  return std::any_of(items_.begin(), items_.end(), [&](const auto& item) { return item.first == name; });
}

double ModelAttributes::get(const std::string& name) const {
  for (const auto& [n, v] : items_)
    if (n == name) return v;
  throw Error("model config: attribute '" + name + "' is missing");
}

Tensor CausalLM::loss(const Tensor& idx, const Tensor& targets) const { return cross_entropy(forward(idx), targets); }

std::unique_ptr<nn::KVCache> CausalLM::new_kv_cache(int64_t) const { return nullptr; }

nn::KVCache* CausalLM::reusable_kv_cache(int64_t batch) const {
  if (!kv_cache_ || kv_cache_batch_ != batch || kv_cache_->dtype() != parameters().front().dtype()) {
    kv_cache_ = new_kv_cache(batch);
    kv_cache_batch_ = batch;
  }
  return kv_cache_.get();
}

Tensor CausalLM::decode_step(const Tensor&, const Tensor&, nn::KVCache&) const {
  throw Error("the " + architecture() + " model has no key/value cache (decode_step)");
}

Tensor CausalLM::decode_step(const Tensor& token, int64_t position, nn::KVCache& cache) const {
  if (position < 0 || position >= cache.max_len())
    throw Error(architecture() + ".decode_step: position " + std::to_string(position) + " is outside the cache's [0, " +
                std::to_string(cache.max_len()) + ")");
  return decode_step(token, Tensor::from_ints({static_cast<int32_t>(position)}, {1}), cache);
}

void check_decode_step(const CausalLM& model, const Tensor& token, const Tensor& position) {
  if (token.dtype() != DType::i32 || token.rank() != 2 || token.shape()[1] != 1)
    throw Error(model.architecture() + ".decode_step: expected one token id per sequence, i32 (B, 1), received " +
                std::string(dtype_name(token.dtype())) + token.shape().str());
  if (position.dtype() != DType::i32 || position.shape() != Shape{1})
    throw Error(model.architecture() + ".decode_step: expected the position as i32 [1], received " +
                std::string(dtype_name(position.dtype())) + position.shape().str());
}

const Architecture& architecture(const std::string& name) {
  std::string known;
  for (const Architecture& a : architectures()) {
    if (a.name == name) return a;
    known += (known.empty() ? "" : ", ") + a.name;
  }
  throw Error("unknown model architecture '" + name + "' (known: " + known + ")");
}

namespace {
std::string bound(double b) { return b == 2147483648.0 ? "2^31" : fmt::format("{}", b); }
}  // namespace

ModelAttributes check_attributes(const Architecture& arch, const ModelAttributes& attributes, const std::string& source,
                                 int64_t file_version) {
  ModelAttributes out;
  for (const AttributeSpec& s : arch.attributes) {
    if (!attributes.has(s.name)) {
      if (!s.has_default || (file_version > 0 && file_version >= s.required_from_version))
        throw Error(fmt::format("{}: attribute '{}' of the {} config is missing", source, s.name, arch.name));
      out.set(s.name, s.default_value);
      continue;
    }
    const double v = attributes.get(s.name);
    if (s.integer && !(v >= s.min && v < s.max && v == std::floor(v)))
      throw Error(fmt::format("{}: attribute '{}' is {}; it must lie in [{}, {}) and be a whole number", source, s.name,
                              v, bound(s.min), bound(s.max)));
    if (!s.integer && !(v >= s.min && v < s.max))
      throw Error(fmt::format("{}: attribute '{}' is {}; it must lie in [{}, {})", source, s.name, v, bound(s.min),
                              bound(s.max)));
    out.set(s.name, v);
  }
  for (const auto& [name, v] : attributes.items())
    if (!out.has(name)) throw Error(fmt::format("{}: the {} config has no attribute '{}'", source, arch.name, name));
  return out;
}

std::unique_ptr<CausalLM> make_model(const std::string& name, const ModelAttributes& attributes,
                                     const std::string& source) {
  const Architecture& arch = architecture(name);
  return arch.make(check_attributes(arch, attributes, source));
}

}  // namespace kiln::models
