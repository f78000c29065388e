// Loading and saving kiln weights files.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/hf_tokenizer.hpp>
#include <kiln/train/weights.hpp>

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

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}
}  // namespace

std::string LoadReport::str() const {
  if (empty()) return "none";
  std::string out;
  std::vector<std::string> missing_datasets;
  for (const std::string& name : missing) missing_datasets.push_back(name + " (dataset '" + dataset_path(name) + "')");
  if (!missing.empty()) out += "missing: " + joined(missing_datasets);
  if (!unexpected.empty()) out += std::string(out.empty() ? "" : "; ") + "unexpected: " + joined(unexpected);
  return out;
}

std::vector<std::string> unread_datasets(const h5::File& f, const std::vector<std::string>& read) {
  const std::map<std::string, std::string> all = f.datasets();
  std::set<std::string> read_objects;
  for (const std::string& name : read) {
    auto it = all.find(name);
    if (it != all.end()) read_objects.insert(it->second);
  }
  std::vector<std::string> out;
  for (const auto& [name, object] : all)
    if (!read_objects.count(object) && name.rfind("tokenizer/", 0) != 0) out.push_back(name);
  return out;
}

void write_model_spec(h5::File& f, const models::CausalLM& model) {
  const models::Architecture& arch = models::architecture(model.architecture());
  const models::ModelAttributes a = model.attributes();
  f.write_attribute("architecture", arch.name);
  for (const models::AttributeSpec& s : arch.attributes) {
    if (s.integer)
      f.write_attribute(s.name, a.get_int(s.name));
    else
      f.write_attribute(s.name, a.get(s.name));
  }
}

ModelSpec read_model_spec(const h5::File& f) {
  // Both kinds of file carry format_version (their readers check its range first).
  const int64_t version = f.read_int_attribute("format_version");
  const bool whole_config = version >= kFormatWithWholeConfig;
  const std::string source = "'" + f.path() + "' (written as format_version " + std::to_string(version) + ")";
  if (whole_config && !f.has_attribute("architecture")) throw Error(source + ": attribute 'architecture' is missing");
  ModelSpec spec;
  spec.architecture = f.has_attribute("architecture") ? f.read_string_attribute("architecture") : "gpt";
  const models::Architecture* arch = nullptr;
  try {
    arch = &models::architecture(spec.architecture);
  } catch (const Error& e) {
    throw Error("'" + f.path() + "': " + e.what());
  }
  // Each value is checked against its range before anything is allocated: a corrupt or hostile
  // size is refused here.
  models::ModelAttributes read;
  for (const models::AttributeSpec& s : arch->attributes)
    if (f.has_attribute(s.name))
      read.set(s.name, s.integer ? static_cast<double>(f.read_int_attribute(s.name)) : f.read_real_attribute(s.name));
  spec.attributes = models::check_attributes(*arch, read, source, version);
  return spec;
}

void require_finite(const HostTensor& t, const std::string& file, const std::string& dataset) {
  if (t.dtype() != DType::f32 && t.dtype() != DType::f64) return;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.get(i)))
      throw Error("'" + file + "': dataset '" + dataset + "' holds a non-finite value (" + std::to_string(t.get(i)) +
                  ") at element " + std::to_string(i));
}

void write_tokenizer(h5::File& f, const Tokenizer& tokenizer, int64_t vocab_size) {
  if (tokenizer.kind() == Tokenizer::Kind::HfBpe) {
    // A published tokenizer may have fewer ids than the model's (padded) embedding, never more.
    if (tokenizer.vocab_size() > vocab_size)
      throw Error("'" + f.path() + "': the tokenizer.json has ids up to " + std::to_string(tokenizer.vocab_size() - 1) +
                  ", the model's vocab_size is " + std::to_string(vocab_size));
    f.write_attribute("tokenizer", std::string(tokenizer.kind_name()));
    const std::string& text = tokenizer.hf_bpe().json();
    f.write_attribute("tokenizer_json_bytes", static_cast<int64_t>(text.size()));
    HostTensor packed = HostTensor::zeros(DType::i32, Shape{static_cast<int64_t>((text.size() + 3) / 4)});
    std::memcpy(packed.raw(), text.data(), text.size());  // the bytes, four to an int32 (HDF5 I/O is typed)
    f.write("tokenizer/json", packed);
    return;
  }
  if (tokenizer.vocab_size() != vocab_size)
    throw Error("'" + f.path() + "': the " + tokenizer.kind_name() + " tokenizer has " +
                std::to_string(tokenizer.vocab_size()) + " ids, the model's vocab_size is " +
                std::to_string(vocab_size));
  f.write_attribute("tokenizer", std::string(tokenizer.kind_name()));
  if (tokenizer.kind() == Tokenizer::Kind::Bpe) {
    const auto& merges = tokenizer.bpe_model().merges();
    if (merges.empty()) return;  // 256 tokens, the bytes: nothing to store (HDF5 chunks no empty dataset)
    HostTensor m = HostTensor::zeros(DType::i32, Shape{static_cast<int64_t>(merges.size()), 2});
    for (size_t i = 0; i < merges.size(); ++i) {
      m.data<int32_t>()[2 * i] = merges[i].first;
      m.data<int32_t>()[2 * i + 1] = merges[i].second;
    }
    f.write("tokenizer/merges", m);
    return;
  }
  if (tokenizer.kind() != Tokenizer::Kind::Char) return;
  const auto& v = tokenizer.vocab();
  HostTensor vocab = HostTensor::zeros(DType::i32, Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), vocab.data<int32_t>());
  f.write("tokenizer/vocab", vocab);
}

std::optional<Tokenizer> read_tokenizer(const h5::File& f) {
  if (!f.has_attribute("tokenizer")) return std::nullopt;
  // The tokenizer must cover exactly the model's vocabulary: ids the model emits must decode.
  const int64_t vocab_size = read_model_spec(f).attributes.get_int("vocab_size");
  std::string kind = f.read_string_attribute("tokenizer");
  if (kind != "byte" && kind != "char" && kind != "bpe" && kind != "hf-bpe")
    throw Error("'" + f.path() + "': unknown tokenizer '" + kind + "'");
  if (kind == "hf-bpe") {
    const int64_t bytes = f.read_int_attribute("tokenizer_json_bytes");
    if (bytes < 0 || bytes > (int64_t{1} << 32))
      throw Error("'" + f.path() + "': attribute tokenizer_json_bytes is " + std::to_string(bytes) +
                  "; a tokenizer.json of 0 to 4 GiB is expected");
    if (!f.exists("tokenizer/json")) throw Error("'" + f.path() + "': dataset 'tokenizer/json' is missing");
    const DType dtype = f.dataset_dtype("tokenizer/json");
    const Shape shape = f.dataset_shape("tokenizer/json");
    if (dtype != DType::i32 || shape != Shape{(bytes + 3) / 4})
      throw Error("'" + f.path() + "': dataset 'tokenizer/json' must be int32 [" + std::to_string((bytes + 3) / 4) +
                  "] (tokenizer_json_bytes " + std::to_string(bytes) + ", four to an int32), received " +
                  dtype_name(dtype) + shape.str());
    const HostTensor packed = f.read("tokenizer/json");
    const std::string text(static_cast<const char*>(packed.raw()), static_cast<size_t>(bytes));
    Tokenizer t = Tokenizer::hf_bpe(HfBpeTokenizer::from_json(text, "'" + f.path() + "': dataset 'tokenizer/json'"));
    if (t.vocab_size() > vocab_size)
      throw Error("'" + f.path() + "': the tokenizer.json has ids up to " + std::to_string(t.vocab_size() - 1) +
                  ", the model's vocab_size is " + std::to_string(vocab_size));
    return t;
  }
  if (kind == "bpe") {
    // vocab_size - 256 merges, each a pair of earlier ids (checked by BpeModel::from_merges).
    if (vocab_size == 256 && !f.exists("tokenizer/merges")) return Tokenizer::bpe(BpeModel::from_merges({}));
    if (!f.exists("tokenizer/merges")) throw Error("'" + f.path() + "': dataset 'tokenizer/merges' is missing");
    const DType dtype = f.dataset_dtype("tokenizer/merges");
    const Shape shape = f.dataset_shape("tokenizer/merges");
    if (vocab_size < 256 || dtype != DType::i32 || shape != Shape{vocab_size - 256, 2})
      throw Error("'" + f.path() + "': dataset 'tokenizer/merges' must be int32 [vocab_size - 256, 2] = [" +
                  std::to_string(vocab_size - 256) + ", 2], received " + dtype_name(dtype) + shape.str());
    HostTensor m = f.read("tokenizer/merges");
    std::vector<BpeModel::Merge> merges;
    for (int64_t i = 0; i < shape[0]; ++i) merges.emplace_back(m.data<int32_t>()[2 * i], m.data<int32_t>()[2 * i + 1]);
    try {
      return Tokenizer::bpe(BpeModel::from_merges(std::move(merges)));
    } catch (const Error& e) {
      throw Error("'" + f.path() + "': dataset 'tokenizer/merges': " + e.what());
    }
  }
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

ModelSpec read_model_spec(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  check_format(f);
  if (!f.has_attribute("architecture") && !f.has_attribute("vocab_size"))
    throw Error("'" + path +
                "' holds the weights of a module, not of a model (no architecture or config): load them "
                "with load_weights into a module of the same structure");
  return read_model_spec(f);
}

std::unique_ptr<models::CausalLM> load_model(const std::string& path, const LoadOptions& options, LoadReport* report) {
  const ModelSpec spec = read_model_spec(path);
  std::unique_ptr<models::CausalLM> model = models::make_model(spec.architecture, spec.attributes, "'" + path + "'");
  LoadReport found = load_weights(path, *model, options);
  if (report) *report = std::move(found);
  return model;
}

models::GPTConfig read_weights_config(const std::string& path) {
  const ModelSpec spec = read_model_spec(path);
  if (spec.architecture != "gpt") throw Error("'" + path + "' holds a " + spec.architecture + " model, not a gpt");
  return models::GPTConfig::from_attributes(spec.attributes);
}

LoadReport load_weights(const std::string& path, nn::Module& model, const LoadOptions& options) {
  h5::File f = h5::File::open_read(path);
  check_format(f);
  // Read and check every dataset before touching the model.
  LoadReport report;
  std::vector<std::string> read;
  std::vector<std::pair<Tensor, HostTensor>> loaded;
  for (const auto& [name, p] : model.named_parameters()) {
    std::string ds = dataset_path(name);
    if (!f.exists(ds)) {
      report.missing.push_back(name);
      continue;
    }
    DType dt = f.dataset_dtype(ds);
    if (dt != DType::f32)
      throw Error("weights file '" + path + "': dataset '" + ds + "' is " + dtype_name(dt) + ", expected float32");
    Shape shape = f.dataset_shape(ds);
    if (shape != p.shape())
      throw Error("weights file '" + path + "': dataset '" + ds + "' has shape " + shape.str() + ", parameter '" +
                  name + "' needs " + p.shape().str());
    loaded.emplace_back(p, f.read(ds));
    require_finite(loaded.back().second, path, ds);
    read.push_back(ds);
  }
  report.unexpected = unread_datasets(f, read);
  if (options.strict && !report.empty())
    throw Error("weights file '" + path + "' does not match the model parameter for parameter (" + report.str() +
                "); load it with LoadOptions{.strict = false} (the CLI's --non-strict) to load the parameters it has");
  for (const auto& [p, values] : loaded) Engine::current().write_persistent(*p.impl(), values);
  return report;
}

std::optional<Tokenizer> load_tokenizer(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  check_format(f);
  return read_tokenizer(f);
}

HostTensor values_as_f32(const Tensor& p) {
  HostTensor h = p.to_host();
  if (h.dtype() != DType::f32) {  // one copy of a tensor at a time: large models are written near 1x
    HostTensor f32 = HostTensor::zeros(DType::f32, h.shape());
    for (int64_t i = 0; i < h.numel(); ++i) f32.set(i, h.get(i));
    h = f32;
  }
  return h;
}

namespace {

void write_parameters(h5::File& f, const nn::Module& module, const ParameterValues& values) {
  f.write_attribute("format", std::string("kiln-weights"));
  f.write_attribute("format_version", kWeightsFormatVersion);
  for (const auto& [name, p] : module.named_parameters()) {
    const HostTensor h = values(name, p);
    if (h.dtype() != DType::f32 || h.shape() != p.shape())
      throw Error("weights file '" + f.path() + "': the values given for '" + name + "' are " + dtype_name(h.dtype()) +
                  h.shape().str() + ", expected float32" + p.shape().str());
    f.write(dataset_path(name), h);
  }
}

HostTensor model_values(const std::string&, const Tensor& p) { return values_as_f32(p); }
}  // namespace

void save_weights(const std::string& path, const models::CausalLM& model, const Tokenizer* tokenizer) {
  save_weights(path, model, model_values, tokenizer);
}

void save_weights(const std::string& path, const models::CausalLM& model, const ParameterValues& values,
                  const Tokenizer* tokenizer) {
  h5::write_atomically(path, [&](h5::File& f) {
    write_parameters(f, model, values);
    write_model_spec(f, model);
    for (const auto& [alias, listed] : model.tied_names()) f.hard_link(dataset_path(listed), dataset_path(alias));
    if (tokenizer) write_tokenizer(f, *tokenizer, model.vocab_size());
  });
}

void save_module_weights(const std::string& path, const nn::Module& module) {
  h5::write_atomically(path, [&](h5::File& f) { write_parameters(f, module, model_values); });
}

}  // namespace kiln
