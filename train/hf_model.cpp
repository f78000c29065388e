// Hugging Face model directories <-> kiln models (config.json and safetensors).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/models/llama.hpp>
#include <kiln/train/atomic_file.hpp>
#include <kiln/train/hf_model.hpp>
#include <kiln/train/hf_tokenizer.hpp>
#include <kiln/train/json_text.hpp>
#include <kiln/train/safetensors.hpp>
#include <kiln/version.hpp>

namespace kiln {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw Error("cannot read '" + path + "'");
  return text.str();
}

json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  require_json_depth(text, "'" + path + "'");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error("'" + path + "' is not valid JSON (" + e.what() + ")");
  }
}

// Typed reads of config.json's settings; errors name the file and the key.
struct Config {
  std::string path;
  json doc;

  bool has(const std::string& key) const { return doc.contains(key) && !doc[key].is_null(); }
  // The setting as an error message shows it: a value as written, a container by its kind.
  std::string shown(const std::string& key) const {
    if (!doc.contains(key)) return "(absent)";
    return doc[key].is_primitive() ? doc[key].dump() : "an " + std::string(doc[key].type_name());
  }
  double number(const std::string& key) const {
    if (!has(key)) throw Error("'" + path + "': setting '" + key + "' is missing");
    if (!doc[key].is_number()) throw Error("'" + path + "': setting '" + key + "' is " + shown(key) + ", not a number");
    return doc[key].get<double>();
  }
  double number(const std::string& key, double fallback) const { return has(key) ? number(key) : fallback; }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!doc[key].is_string()) throw Error("'" + path + "': setting '" + key + "' is " + shown(key) + ", not a string");
    return doc[key].get<std::string>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!doc[key].is_boolean())
      throw Error("'" + path + "': setting '" + key + "' is " + shown(key) + ", not true or false");
    return doc[key].get<bool>();
  }
  [[noreturn]] void refuse(const std::string& key, const std::string& why) const {
    throw Error("'" + path + "': setting " + key + " = " + shown(key) + " is not supported: " + why);
  }
};

std::string architecture_of(const Config& c) {
  std::string hf;
  if (c.doc.contains("architectures") && c.doc["architectures"].is_array() && !c.doc["architectures"].empty() &&
      c.doc["architectures"][0].is_string())
    hf = c.doc["architectures"][0].get<std::string>();
  const std::string type = c.string("model_type", "");
  if (hf == "GPT2LMHeadModel" || (hf.empty() && type == "gpt2")) return "gpt";
  if (hf == "LlamaForCausalLM" || (hf.empty() && type == "llama")) return "llama";
  throw Error("'" + c.path + "': architecture '" + (hf.empty() ? type : hf) +
              "' is not one kiln imports (GPT2LMHeadModel, LlamaForCausalLM)");
}

models::ModelAttributes gpt_attributes(const Config& c) {
  const std::string act = c.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    c.refuse("activation_function", "kiln's GPT uses GELU's tanh approximation (gelu_new)");
  const double n_embd = c.number("n_embd");
  if (!c.boolean("scale_attn_weights", true)) c.refuse("scale_attn_weights", "kiln scales attention by 1/sqrt(d)");
  if (c.boolean("scale_attn_by_inverse_layer_idx", false))
    c.refuse("scale_attn_by_inverse_layer_idx", "kiln scales attention by 1/sqrt(d) only");
  if (c.boolean("add_cross_attention", false)) c.refuse("add_cross_attention", "kiln's GPT is a decoder only");
  if (!c.boolean("tie_word_embeddings", true)) c.refuse("tie_word_embeddings", "kiln's GPT ties lm_head to wte");
  // kiln's GPT has one dropout rate where GPT-2 has three (embeddings, attention, residual).
  const double resid = c.number("resid_pdrop", 0.1);
  for (const char* key : {"embd_pdrop", "attn_pdrop"})
    if (c.number(key, 0.1) != resid)
      c.refuse(key, "kiln's GPT has one dropout rate; resid_pdrop is " + std::to_string(resid));
  models::ModelAttributes a;
  a.set("vocab_size", c.number("vocab_size"));
  a.set("block_size", c.number("n_positions"));
  a.set("n_layer", c.number("n_layer"));
  a.set("n_head", c.number("n_head"));
  a.set("n_embd", n_embd);
  a.set("dropout", resid);
  a.set("ffn_hidden", c.has("n_inner") ? c.number("n_inner") : 4 * n_embd);
  a.set("norm_eps", c.number("layer_norm_epsilon", models::GPTConfig{}.norm_eps));  // GPT-2's default
  return a;
}

models::ModelAttributes llama_attributes(const Config& c) {
  if (c.string("hidden_act", "silu") != "silu") c.refuse("hidden_act", "kiln's Llama MLP is SwiGLU (silu)");
  if (c.has("sliding_window")) c.refuse("sliding_window", "kiln's attention is full causal attention");
  const double hidden = c.number("hidden_size"), heads = c.number("num_attention_heads");
  if (c.has("head_dim") && c.number("head_dim") * heads != hidden)
    c.refuse("head_dim", "kiln's Llama heads are hidden_size / num_attention_heads wide");
  // The rotary base and scaling: transformers 5 writes rope_parameters {rope_type, rope_theta, ...};
  // earlier versions rope_theta and rope_scaling {type or rope_type, ...}.
  double theta = c.number("rope_theta", 10000.0);
  std::string rope_type = "default";
  std::map<std::string, double> rope;  // the scaling's numbers
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!c.has(key)) continue;
    const json& r = c.doc[key];
    if (!r.is_object()) c.refuse(key, "expected an object");
    for (const auto& [name, v] : r.items()) {
      if (name == "rope_type" || name == "type") {
        if (!v.is_string()) c.refuse(key, name + " is not a string");
        rope_type = v.get<std::string>();
      } else if (v.is_number()) {
        rope[name] = v.get<double>();
      } else if (!v.is_null()) {
        c.refuse(key, name + " is not a number");
      }
    }
  }
  if (rope.count("rope_theta")) theta = rope["rope_theta"];
  models::ModelAttributes a;
  if (rope_type == "llama3") {
    for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
      if (!rope.count(k)) throw Error("'" + c.path + "': llama3 rope scaling without its " + k);
    a.set("rope_scaling_factor", rope["factor"]);
    a.set("rope_low_freq_factor", rope["low_freq_factor"]);
    a.set("rope_high_freq_factor", rope["high_freq_factor"]);
    a.set("rope_original_max_position", rope["original_max_position_embeddings"]);
  } else if (rope_type != "default") {
    throw Error("'" + c.path + "': rope scaling of type '" + rope_type +
                "' is not implemented in kiln (it implements none and llama3)");
  }
  a.set("attention_bias", c.boolean("attention_bias", false) ? 1 : 0);
  a.set("mlp_bias", c.boolean("mlp_bias", false) ? 1 : 0);
  a.set("vocab_size", c.number("vocab_size"));
  a.set("block_size", c.number("max_position_embeddings"));
  a.set("n_layer", c.number("num_hidden_layers"));
  a.set("n_head", heads);
  a.set("n_kv_head", c.number("num_key_value_heads", heads));
  a.set("n_embd", hidden);
  a.set("ffn_hidden", c.number("intermediate_size"));
  a.set("rope_theta", theta);
  a.set("norm_eps", c.number("rms_norm_eps", 1e-6));
  a.set("tie_embeddings", c.boolean("tie_word_embeddings", false) ? 1 : 0);
  return a;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_gpt_conv1d_weight(const std::string& name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (ends_with(name, suffix)) return true;
  return false;
}

// Stored tensors that are not parameters: GPT-2's causal-mask buffers, Llama's rotary frequencies.
bool is_known_buffer(const std::string& architecture, const std::string& name) {
  if (architecture == "gpt") return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
  return ends_with(name, ".rotary_emb.inv_freq");
}

HostTensor transposed(const HostTensor& t) {
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  HostTensor out = HostTensor::zeros(DType::f32, Shape{cols, rows});
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  return out;
}

// The stored tensors of a model directory: one file or the shards of an index, each tensor found
// in the file the index names (or anywhere, for one file).
struct Checkpoint {
  std::vector<SafetensorsFile> files;
  std::map<std::string, std::pair<size_t, const SafetensorsEntry*>> tensors;  // name -> (file, entry)

  explicit Checkpoint(const std::string& dir) {
    const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(single)) {  // transformers' order: the single file first
      files.emplace_back(single.string());
      for (const SafetensorsEntry& e : files[0].header().tensors) tensors[e.name] = {0, &e};
    } else if (fs::exists(index)) {
      const json doc = read_json_file(index.string());
      if (!doc.contains("weight_map") || !doc["weight_map"].is_object())
        throw Error("'" + index.string() + "': no weight_map object");
      std::map<std::string, size_t> shard_of;
      std::map<std::string, std::string> listed;  // tensor -> shard file name
      for (const auto& [name, file] : doc["weight_map"].items()) {
        if (!file.is_string()) throw Error("'" + index.string() + "': weight_map['" + name + "'] is not a file name");
        const std::string shard = file.get<std::string>();
        if (shard.find('/') != std::string::npos || shard == "..")
          throw Error("'" + index.string() + "': shard '" + shard + "' is not a file name inside the directory");
        if (!shard_of.count(shard)) {
          shard_of[shard] = files.size();
          files.emplace_back((fs::path(dir) / shard).string());
        }
        listed[name] = shard;
      }
      for (const auto& [name, shard] : listed) {
        const size_t i = shard_of[shard];
        const SafetensorsEntry* e = files[i].find(name);
        if (!e) throw Error("'" + files[i].path() + "' holds no tensor '" + name + "' (weight_map places it there)");
        tensors[name] = {i, e};
      }
      for (const SafetensorsFile& f : files)
        for (const SafetensorsEntry& e : f.header().tensors)
          if (!listed.count(e.name))
            throw Error("'" + f.path() + "': tensor '" + e.name + "' is not in " + index.string() + "'s weight_map");
    } else {
      throw Error("'" + dir + "' has neither model.safetensors nor model.safetensors.index.json (kiln reads " +
                  "safetensors only: save a PyTorch checkpoint with save_pretrained(DIR, safe_serialization=True))");
    }
  }
};

}  // namespace

std::vector<HfTensorName> hf_tensor_names(const models::CausalLM& model) {
  std::vector<HfTensorName> out;
  const bool gpt = model.architecture() == "gpt";
  for (const auto& [name, p] : model.named_parameters()) out.push_back({name, name, gpt && is_gpt_conv1d_weight(name)});
  return out;
}

ModelSpec read_hf_config(const std::string& dir) {
  Config c{(fs::path(dir) / "config.json").string(), {}};
  if (!fs::exists(c.path)) throw Error("'" + dir + "' is not a Hugging Face model directory: it has no config.json");
  c.doc = read_json_file(c.path);
  if (!c.doc.is_object()) throw Error("'" + c.path + "' is not a JSON object");
  ModelSpec spec;
  spec.architecture = architecture_of(c);
  const models::ModelAttributes a = spec.architecture == "gpt" ? gpt_attributes(c) : llama_attributes(c);
  spec.attributes = models::check_attributes(models::architecture(spec.architecture), a, "'" + c.path + "'");
  return spec;
}

namespace {

// Where each of a model's parameters comes from in a directory's checkpoint, every name and shape
// checked (nothing read yet but a tied copy, compared with what it is tied to).
struct ImportPlan {
  struct Source {
    std::string kiln;  // the parameter's name
    size_t file;
    const SafetensorsEntry* entry;
    bool transposed;
  };
  std::vector<Source> sources;  // in the model's parameter order
  std::vector<std::string> skipped;
};

ImportPlan plan_import(const std::string& dir, const Checkpoint& ckpt, const models::CausalLM& model) {
  const std::string architecture = model.architecture();
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : model.named_parameters()) shapes.emplace(name, p.shape());
  // GPT-2 checkpoints made from GPT2Model (the official "gpt2" among them) store the body's
  // tensors without the "transformer." prefix.
  auto stored = [&](const std::string& hf) -> const std::pair<size_t, const SafetensorsEntry*>* {
    auto it = ckpt.tensors.find(hf);
    if (it == ckpt.tensors.end() && architecture == "gpt" && hf.rfind("transformer.", 0) == 0)
      it = ckpt.tensors.find(hf.substr(12));
    return it == ckpt.tensors.end() ? nullptr : &it->second;
  };
  ImportPlan plan;
  std::string missing;
  size_t n_missing = 0;
  for (const HfTensorName& n : hf_tensor_names(model)) {
    const auto* s = stored(n.hf);
    if (!s) {
      missing += (missing.empty() ? "" : ", ") + n.hf;
      ++n_missing;
      continue;
    }
    plan.sources.push_back({n.kiln, s->first, s->second, n.transposed});
  }
  if (n_missing) throw Error("'" + dir + "': " + std::to_string(n_missing) + " parameters are not stored: " + missing);
  std::set<std::string> used;
  for (const ImportPlan::Source& src : plan.sources) {
    Shape want = shapes.at(src.kiln);
    if (src.transposed) want = Shape{want[1], want[0]};
    if (Shape(src.entry->shape) != want)
      throw Error("'" + ckpt.files[src.file].path() + "': tensor '" + src.entry->name + "' has shape " +
                  Shape(src.entry->shape).str() + "; kiln's " + architecture + " parameter '" + src.kiln + "' needs " +
                  want.str() + (src.transposed ? " (GPT-2's Conv1D layout [in, out])" : ""));
    used.insert(src.entry->name);
  }
  // The tensors no parameter reads: known buffers, or a tied head's copy, which must equal the
  // embedding it is tied to; anything else is refused.
  const std::vector<std::pair<std::string, std::string>> tied = model.tied_names();
  for (const auto& [name, where] : ckpt.tensors) {
    if (used.count(name)) continue;
    if (is_known_buffer(architecture, name)) {
      plan.skipped.push_back(name);
      continue;
    }
    const std::string& stored_name = name;  // (clang 14 cannot capture a structured binding)
    auto alias = std::find_if(tied.begin(), tied.end(), [&](const auto& t) { return t.first == stored_name; });
    if (alias != tied.end()) {
      const auto& [file, e] = where;
      const auto& [lfile, le] = *stored(alias->second);
      const HostTensor a = ckpt.files[file].read_f32(*e), b = ckpt.files[lfile].read_f32(*le);
      if (a.shape() != b.shape() || std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0)
        throw Error("'" + ckpt.files[file].path() + "': tensor '" + name + "' differs from '" + le->name +
                    "', but the config ties them (tie_word_embeddings)");
      plan.skipped.push_back(name);
      continue;
    }
    throw Error("'" + ckpt.files[where.first].path() + "': tensor '" + name + "' is not a parameter of kiln's " +
                architecture + " model (unexpected)");
  }
  return plan;
}

// A parameter's values, as kiln lays them out.
HostTensor read_source(const Checkpoint& ckpt, const ImportPlan::Source& src) {
  const SafetensorsFile& f = ckpt.files[src.file];
  HostTensor values = f.read_f32(*src.entry);
  require_finite(values, f.path(), src.entry->name);
  return src.transposed ? transposed(values) : values;
}

// DIR/tokenizer.json into `out`, where present and of the byte-level BPE kind.
void read_tokenizer_json(const std::string& dir, HfImport& out) {
  const fs::path path = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(path)) return;
  const std::string text = read_text_file(path.string());
  if (!HfBpeTokenizer::is_byte_level_bpe(text)) {
    out.tokenizer_note =
        "'" + path.string() + "' is not a byte-level BPE tokenizer (GPT-2's or Llama 3's kind): not imported";
    return;
  }
  try {
    out.tokenizer = Tokenizer::hf_bpe(HfBpeTokenizer::from_json(text, "'" + path.string() + "'"));
  } catch (const UnsupportedTokenizer& e) {
    out.tokenizer_note = std::string(e.what()) + ": the tokenizer is not imported";
  }
}

HfImport import_into(const std::string& dir,
                     const std::function<void(const Checkpoint&, const ImportPlan&, HfImport&)>& load,
                     bool empty_parameters) {
  const ModelSpec spec = read_hf_config(dir);
  const Checkpoint ckpt(dir);
  HfImport out;
  read_tokenizer_json(dir, out);
  const int64_t vocab = spec.attributes.get_int("vocab_size");
  if (out.tokenizer && out.tokenizer->vocab_size() > vocab)  // said before any tensor is converted
    throw Error("'" + dir + "/tokenizer.json' has ids up to " + std::to_string(out.tokenizer->vocab_size() - 1) +
                ", the model's vocab_size is " + std::to_string(vocab));
  for (const SafetensorsFile& f : ckpt.files) out.files.push_back(f.path());
  {
    std::optional<nn::EmptyParameters> empty;
    if (empty_parameters) empty.emplace();
    out.model = models::make_model(spec.architecture, spec.attributes, "'" + dir + "/config.json'");
  }
  const ImportPlan plan = plan_import(dir, ckpt, *out.model);
  out.skipped = plan.skipped;
  load(ckpt, plan, out);
  return out;
}

}  // namespace

HfImport import_hf_model(const std::string& dir, const std::function<void(size_t, size_t)>& progress) {
  return import_into(
      dir,
      [&](const Checkpoint& ckpt, const ImportPlan& plan, HfImport& out) {
        std::map<std::string, Tensor> params;
        for (const auto& [name, p] : out.model->named_parameters()) params.emplace(name, p);
        size_t done = 0;
        for (const ImportPlan::Source& src : plan.sources) {
          Engine::current().write_persistent(*params.at(src.kiln).impl(), read_source(ckpt, src));
          if (progress) progress(++done, plan.sources.size());
        }
      },
      /*empty_parameters=*/false);
}

HfImport convert_hf_model(const std::string& dir, const std::string& out_path,
                          const std::function<void(size_t, size_t)>& progress) {
  return import_into(
      dir,
      [&](const Checkpoint& ckpt, const ImportPlan& plan, HfImport& out) {
        std::map<std::string, const ImportPlan::Source*> by_name;
        for (const ImportPlan::Source& src : plan.sources) by_name[src.kiln] = &src;
        size_t done = 0;
        save_weights(
            out_path, *out.model,
            [&](const std::string& name, const Tensor&) {
              HostTensor values = read_source(ckpt, *by_name.at(name));
              if (progress) progress(++done, plan.sources.size());
              return values;
            },
            out.tokenizer ? &*out.tokenizer : nullptr);
      },
      /*empty_parameters=*/true);
}

void export_hf_model(const models::CausalLM& model, const std::string& dir, DType dtype, const Tokenizer* tokenizer) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Error(std::string("kiln export: --dtype must be f32 or bf16, received ") + dtype_name(dtype));
  const models::ModelAttributes a = model.attributes();
  const bool gpt = model.architecture() == "gpt";
  const char* dtype_word = dtype == DType::f32 ? "float32" : "bfloat16";
  json config;
  if (gpt) {
    config = {{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", a.get_int("vocab_size")},
              {"n_positions", a.get_int("block_size")},
              {"n_layer", a.get_int("n_layer")},
              {"n_head", a.get_int("n_head")},
              {"n_embd", a.get_int("n_embd")},
              {"n_inner", a.get_int("ffn_hidden")},
              {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", a.get("norm_eps")},
              {"resid_pdrop", a.get("dropout")},
              {"embd_pdrop", a.get("dropout")},
              {"attn_pdrop", a.get("dropout")},
              {"tie_word_embeddings", true},
              {"bos_token_id", nullptr},
              {"eos_token_id", nullptr}};
  } else if (model.architecture() == "llama") {
    const int64_t heads = a.get_int("n_head"), hidden = a.get_int("n_embd");
    const models::LlamaConfig lc = models::LlamaConfig::from_attributes(a);
    json rope = {{"rope_type", "default"}, {"rope_theta", lc.rope_theta}};
    if (lc.rope_scaling.enabled())
      rope = {{"rope_type", "llama3"},
              {"rope_theta", lc.rope_theta},
              {"factor", lc.rope_scaling.factor},
              {"low_freq_factor", lc.rope_scaling.low_freq_factor},
              {"high_freq_factor", lc.rope_scaling.high_freq_factor},
              {"original_max_position_embeddings", lc.rope_scaling.original_max_position}};
    config = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", a.get_int("vocab_size")},
              {"max_position_embeddings", a.get_int("block_size")},
              {"num_hidden_layers", a.get_int("n_layer")},
              {"num_attention_heads", heads},
              {"num_key_value_heads", a.get_int("n_kv_head")},
              {"hidden_size", hidden},
              {"head_dim", hidden / heads},
              {"intermediate_size", lc.hidden()},
              {"hidden_act", "silu"},
              {"rms_norm_eps", lc.norm_eps},
              {"rope_theta", lc.rope_theta},
              // transformers 5 reads rope_parameters, earlier versions rope_theta and rope_scaling
              {"rope_parameters", rope},
              {"rope_scaling", lc.rope_scaling.enabled() ? rope : json(nullptr)},
              {"attention_bias", lc.attention_bias},
              {"mlp_bias", lc.mlp_bias},
              {"tie_word_embeddings", a.get_int("tie_embeddings") != 0},
              {"bos_token_id", nullptr},
              {"eos_token_id", nullptr}};
  } else {
    throw Error("kiln export: no Hugging Face architecture for kiln's '" + model.architecture() + "'");
  }
  config["torch_dtype"] = dtype_word;
  config["kiln_version"] = version_string;
  // Files an export would leave stale beside the new ones: refused rather than deleted.
  const bool writes_tokenizer = tokenizer && tokenizer->hf_tokenizer_json();
  if (fs::exists(fs::path(dir) / "model.safetensors.index.json"))
    throw Error("kiln export: '" + dir +
                "' holds a sharded checkpoint (model.safetensors.index.json); export into "
                "another directory");
  if (!writes_tokenizer && fs::exists(fs::path(dir) / "tokenizer.json"))
    throw Error("kiln export: '" + dir + "' holds a tokenizer.json that this model's (" +
                (tokenizer ? std::string(tokenizer->kind_name()) + " tokenizer" : std::string("no tokenizer")) +
                ") would not replace; export into another directory");
  fs::create_directories(dir);
  const std::vector<HfTensorName> names = hf_tensor_names(model);
  std::map<std::string, Tensor> params;
  for (const auto& [name, p] : model.named_parameters()) params.emplace(name, p);
  std::vector<SafetensorsTensorSpec> specs;
  for (const HfTensorName& n : names) {
    Shape s = params.at(n.kiln).shape();
    specs.push_back({n.hf, dtype, n.transposed ? Shape{s[1], s[0]} : s});
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), specs,
                    [&](size_t i) {
                      const HostTensor h = values_as_f32(params.at(names[i].kiln));
                      return names[i].transposed ? transposed(h) : h;
                    },
                    {{"format", "pt"}});
  write_file_atomically((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
  if (tokenizer) {
    if (std::optional<std::string> text = tokenizer->hf_tokenizer_json())
      write_file_atomically((fs::path(dir) / "tokenizer.json").string(), *text);
  }
}

}  // namespace kiln
