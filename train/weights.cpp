// Loading and saving kiln weights files.
#include "train/weights.hpp"

#include <algorithm>
#include <cmath>

#include "circuit/ir/error.hpp"
#include "train/hdf5_file.hpp"

namespace kiln {

std::string dataset_path(const std::string& parameter_name) {
  std::string p = parameter_name;
  std::replace(p.begin(), p.end(), '.', '/');
  return p;
}

namespace {
void check_format(const h5::File& f) {
  if (!f.has_attribute("format") || f.read_string_attribute("format") != "kiln-weights")
    throw Error("'" + f.path() + "' is not a kiln weights file (root attribute format = \"kiln-weights\" missing)");
  int64_t v = f.read_int_attribute("format_version");
  if (v < 1 || v > kWeightsFormatVersion)
    throw Error("'" + f.path() + "' has format_version " + std::to_string(v) + "; this kiln reads versions 1 to " +
                std::to_string(kWeightsFormatVersion));
}
}  // namespace

void write_model_config(h5::File& f, const models::GPTConfig& c) {
  f.write_attribute("vocab_size", c.vocab_size);
  f.write_attribute("block_size", c.block_size);
  f.write_attribute("n_layer", c.n_layer);
  f.write_attribute("n_head", c.n_head);
  f.write_attribute("n_embd", c.n_embd);
}

models::GPTConfig read_model_config(const h5::File& f) {
  models::GPTConfig c;
  // Each size in [1, 2^31): a corrupt or hostile value is refused before any allocation.
  auto size = [&](const char* name) {
    const int64_t v = f.read_int_attribute(name);
    if (v < 1 || v >= (int64_t{1} << 31))
      throw Error("'" + f.path() + "': attribute '" + name + "' is " + std::to_string(v) +
                  "; a model size must lie in [1, 2^31)");
    return v;
  };
  c.vocab_size = size("vocab_size");
  c.block_size = size("block_size");
  c.n_layer = size("n_layer");
  c.n_head = size("n_head");
  c.n_embd = size("n_embd");
  return c;
}

void require_finite(const HostTensor& t, const std::string& file, const std::string& dataset) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::f64) return;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.get(i)))
      throw Error("'" + file + "': dataset '" + dataset + "' holds a non-finite value (" + std::to_string(t.get(i)) +
                  ") at element " + std::to_string(i));
}

void write_tokenizer(h5::File& f, const Tokenizer& tokenizer, int64_t vocab_size) {
  if (tokenizer.vocab_size() != vocab_size)
    throw Error("'" + f.path() + "': the " + tokenizer.kind_name() + " tokenizer has " +
                std::to_string(tokenizer.vocab_size()) + " ids, the model's vocab_size is " +
                std::to_string(vocab_size));
  f.write_attribute("tokenizer", std::string(tokenizer.kind_name()));
  if (tokenizer.kind() != Tokenizer::Kind::Char) return;
  const auto& v = tokenizer.vocab();
  HostTensor vocab = HostTensor::zeros(DType::i32, Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), vocab.data<int32_t>());
  f.write("tokenizer/vocab", vocab);
}

std::optional<Tokenizer> read_tokenizer(const h5::File& f) {
  if (!f.has_attribute("tokenizer")) return std::nullopt;
  // The tokenizer must cover exactly the model's vocabulary: ids the model emits must decode.
  const int64_t vocab_size = read_model_config(f).vocab_size;
  std::string kind = f.read_string_attribute("tokenizer");
  if (kind != "byte" && kind != "char") throw Error("'" + f.path() + "': unknown tokenizer '" + kind + "'");
  if (kind == "byte") {
    if (vocab_size != 256)
      throw Error("'" + f.path() + "': a byte tokenizer has 256 ids, the model's vocab_size is " +
                  std::to_string(vocab_size));
    return Tokenizer::byte_level();
  }
  if (!f.exists("tokenizer/vocab")) throw Error("'" + f.path() + "': dataset 'tokenizer/vocab' is missing");
  const DType dtype = f.dataset_dtype("tokenizer/vocab");
  const Shape shape = f.dataset_shape("tokenizer/vocab");
  if (dtype != DType::i32 || shape != Shape{vocab_size})
    throw Error("'" + f.path() + "': dataset 'tokenizer/vocab' must be int32 [" + std::to_string(vocab_size) +
                "] (the model's vocab_size), received " + dtype_name(dtype) + shape.str());
  HostTensor v = f.read("tokenizer/vocab");
  try {
    return Tokenizer::from_vocab(std::vector<int32_t>(v.data<int32_t>(), v.data<int32_t>() + v.numel()));
  } catch (const Error& e) {
    throw Error("'" + f.path() + "': dataset 'tokenizer/vocab': " + e.what());
  }
}

models::GPTConfig read_weights_config(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  check_format(f);
  return read_model_config(f);
}

void load_weights(const std::string& path, nn::Module& model) {
  h5::File f = h5::File::open_read(path);
  check_format(f);
  // Read and check every dataset before touching the model.
  std::vector<std::pair<Tensor, HostTensor>> loaded;
  for (const auto& [name, p] : model.named_parameters()) {
    std::string ds = dataset_path(name);
    if (!f.exists(ds))
      throw Error("weights file '" + path + "': dataset '" + ds + "' for parameter '" + name + "' is missing");
    DType dt = f.dataset_dtype(ds);
    if (dt != DType::f32)
      throw Error("weights file '" + path + "': dataset '" + ds + "' is " + dtype_name(dt) + ", expected float32");
    Shape shape = f.dataset_shape(ds);
    if (shape != p.shape())
      throw Error("weights file '" + path + "': dataset '" + ds + "' has shape " + shape.str() + ", parameter '" +
                  name + "' needs " + p.shape().str());
    loaded.emplace_back(p, f.read(ds));
    require_finite(loaded.back().second, path, ds);
  }
  for (const auto& [p, values] : loaded) Engine::current().write_persistent(*p.impl(), values);
}

std::optional<Tokenizer> load_tokenizer(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  check_format(f);
  return read_tokenizer(f);
}

void save_weights(const std::string& path, const models::GPT& model, const Tokenizer* tokenizer) {
  h5::write_atomically(path, [&](h5::File& f) {
    f.write_attribute("format", std::string("kiln-weights"));
    f.write_attribute("format_version", kWeightsFormatVersion);
    write_model_config(f, model.config());
    for (const auto& [name, p] : model.named_parameters()) {
      HostTensor h = p.to_host();
      HostTensor f32 = HostTensor::zeros(DType::f32, h.shape());
      for (int64_t i = 0; i < h.numel(); ++i) f32.set(i, h.get(i));
      f.write(dataset_path(name), f32);
    }
    f.hard_link("transformer/wte/weight", "lm_head/weight");
    if (tokenizer) write_tokenizer(f, *tokenizer, model.config().vocab_size);
  });
}

}  // namespace kiln
