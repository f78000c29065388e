// Checkpoint save (atomic) and load (all-or-nothing).
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/weights.hpp>

namespace kiln {

namespace {

h5::File open_checkpoint(const std::string& path) {
  h5::File f = h5::File::open_read(path);
  if (!f.has_attribute("format") || f.read_string_attribute("format") != "kiln-checkpoint")
    throw Error("'" + path + "' is not a kiln checkpoint (root attribute format = \"kiln-checkpoint\" missing)");
  const int64_t version = f.has_attribute("format_version") ? f.read_int_attribute("format_version") : -1;
  if (version < 1 || version > kCheckpointFormatVersion)
    throw Error("checkpoint '" + path + "' has format_version " +
                (version < 0 ? std::string("(missing)") : std::to_string(version)) +
                "; this kiln reads versions 1 to " + std::to_string(kCheckpointFormatVersion));
  return f;
}

}  // namespace

void save_checkpoint(const std::string& path, const models::CausalLM& model, const optim::AdamW& opt,
                     const Tokenizer& tokenizer, const CheckpointState& state) {
  save_checkpoint(path, model, opt, &tokenizer, state);
}

void save_checkpoint(const std::string& path, const models::CausalLM& model, const optim::AdamW& opt,
                     const Tokenizer* tokenizer, const CheckpointState& state) {
  save_checkpoint(path, model, opt.whole_moments(), tokenizer, state);
}

void save_checkpoint(const std::string& path, const models::CausalLM& model, const optim::AdamWMoments& moments,
                     const Tokenizer* tokenizer, const CheckpointState& state) {
  h5::write_atomically(path, [&](h5::File& f) {
    f.write_attribute("format", std::string("kiln-checkpoint"));
    f.write_attribute("format_version", kCheckpointFormatVersion);
    write_model_spec(f, model);
    f.write_attribute("step", state.step);
    f.write_attribute("data_seed", static_cast<int64_t>(state.data_seed));
    f.write_attribute("rng_seed", static_cast<int64_t>(Engine::current().seed()));
    f.write_attribute("rng_counter", static_cast<int64_t>(Engine::current().random_counter()));
    if (tokenizer) write_tokenizer(f, *tokenizer, model.vocab_size());
    auto params = model.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string ds = dataset_path(params[i].first);
      f.write("model/" + ds, params[i].second.to_host());
      f.write("exp_avg/" + ds, moments.exp_avg.at(i));
      f.write("exp_avg_sq/" + ds, moments.exp_avg_sq.at(i));
    }
  });
}

std::unique_ptr<models::CausalLM> read_checkpoint_model(const std::string& path) {
  const ModelSpec spec = read_model_spec(open_checkpoint(path));
  return models::make_model(spec.architecture, spec.attributes, "checkpoint '" + path + "'");
}

models::GPTConfig read_checkpoint_config(const std::string& path) {
  const ModelSpec spec = read_model_spec(open_checkpoint(path));
  if (spec.architecture != "gpt")
    throw Error("checkpoint '" + path + "' holds a " + spec.architecture + " model, not a gpt");
  return models::GPTConfig::from_attributes(spec.attributes);
}

std::optional<Tokenizer> read_checkpoint_tokenizer_if_any(const std::string& path) {
  return read_tokenizer(open_checkpoint(path));
}

Tokenizer read_checkpoint_tokenizer(const std::string& path) {
  std::optional<Tokenizer> t = read_checkpoint_tokenizer_if_any(path);
  if (!t) throw Error("checkpoint '" + path + "' has no tokenizer");
  return *t;
}

CheckpointState load_checkpoint(const std::string& path, models::CausalLM& model, optim::AdamW& opt) {
  h5::File f = open_checkpoint(path);
  const ModelSpec spec = read_model_spec(f);
  if (spec.architecture != model.architecture())
    throw Error("checkpoint '" + path + "' holds a " + spec.architecture + " model; this model is a " +
                model.architecture());
  auto params = model.named_parameters();
  std::vector<std::pair<Tensor, HostTensor>> loaded;
  optim::AdamWMoments moments;
  std::vector<std::string> read;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string ds = dataset_path(params[i].first);
    for (const std::string group : {"model/", "exp_avg/", "exp_avg_sq/"}) {
      const Tensor& target = params[i].second;  // the moments have the parameter's shape and dtype
      if (!f.exists(group + ds)) throw Error("checkpoint '" + path + "': dataset '" + group + ds + "' is missing");
      HostTensor h = f.read(group + ds);
      if (h.shape() != target.shape() || h.dtype() != target.dtype())
        throw Error("checkpoint '" + path + "': dataset '" + group + ds + "' is " + dtype_name(h.dtype()) +
                    h.shape().str() + ", expected " + dtype_name(target.dtype()) + target.shape().str());
      require_finite(h, path, group + ds);
      if (group == "exp_avg_sq/")
        for (int64_t e = 0; e < h.numel(); ++e)
          if (h.get(e) < 0)
            throw Error("checkpoint '" + path + "': dataset '" + group + ds + "' holds a negative second moment (" +
                        std::to_string(h.get(e)) + ") at element " + std::to_string(e));
      if (group == "model/") loaded.emplace_back(target, h);
      if (group == "exp_avg/") moments.exp_avg.push_back(h);
      if (group == "exp_avg_sq/") moments.exp_avg_sq.push_back(h);
      read.push_back(group + ds);
    }
  }
  if (const std::vector<std::string> unread = unread_datasets(f, read); !unread.empty()) {
    std::string names;
    for (const std::string& n : unread) names += (names.empty() ? "'" : ", '") + n + "'";
    throw Error("checkpoint '" + path + "': " + (unread.size() > 1 ? "datasets " : "dataset ") + names +
                (unread.size() > 1 ? " belong" : " belongs") + " to no parameter of this " + model.architecture() +
                " model");
  }
  CheckpointState state;
  state.step = f.read_int_attribute("step");
  if (state.step < 0 || state.step >= (int64_t{1} << 40))
    throw Error("checkpoint '" + path + "': step " + std::to_string(state.step) + " is not a step count");
  state.data_seed = static_cast<uint64_t>(f.read_int_attribute("data_seed"));
  const auto rng_seed = static_cast<uint64_t>(f.read_int_attribute("rng_seed"));
  // Seeds are any 64-bit pattern (stored as int64); a counter counts random draws from 0.
  const int64_t rng_counter = f.read_int_attribute("rng_counter");
  if (rng_counter < 0)
    throw Error("checkpoint '" + path + "': attribute 'rng_counter' is " + std::to_string(rng_counter) +
                "; it counts the random values drawn and must be at least 0");
  opt.check_moments(moments);  // before anything changes
  for (const auto& [t, h] : loaded) Engine::current().write_persistent(*t.impl(), h);
  opt.set_moments(moments);
  opt.set_steps(state.step);
  Engine::current().manual_seed(rng_seed);
  Engine::current().set_random_counter(static_cast<uint64_t>(rng_counter));
  return state;
}

}  // namespace kiln
