// Hugging Face model directories (train/hf_model): GPT-2's Conv1D weights are stored [in, out]
// and must arrive transposed (checked on a directory written here by hand, not by kiln's
// exporter, so that a mistake made both ways cannot hide); buffers are skipped; shards read like
// one file; settings kiln does not implement, missing, unexpected and misshapen tensors are
// refused by name. transformers itself is the oracle in scripts/check_hf_models.py (CTest
// KilnImportsHuggingFaceModels).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/models/llama.hpp>
#include <kiln/train/bpe.hpp>
#include <kiln/train/hf_model.hpp>
#include <kiln/train/hf_tokenizer.hpp>
#include <kiln/train/safetensors.hpp>

#include "expect_error.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct StoredTensor {
  std::string name;
  Shape shape;
};

// GPT-2's tensors for C = 4, one layer, 6 tokens, 4 positions, in transformers' layout.
std::vector<StoredTensor> gpt2_tensors(const std::string& prefix) {
  std::vector<StoredTensor> t = {{"wte.weight", {6, 4}}, {"wpe.weight", {4, 4}}, {"ln_f.weight", {4}}, {"ln_f.bias", {4}}};
  const std::string h = "h.0.";
  for (const char* ln : {"ln_1", "ln_2"}) {
    t.push_back({h + ln + ".weight", {4}});
    t.push_back({h + ln + ".bias", {4}});
  }
  t.push_back({h + "attn.c_attn.weight", {4, 12}});  // Conv1D: [in, out]
  t.push_back({h + "attn.c_attn.bias", {12}});
  t.push_back({h + "attn.c_proj.weight", {4, 4}});
  t.push_back({h + "attn.c_proj.bias", {4}});
  t.push_back({h + "mlp.c_fc.weight", {4, 16}});
  t.push_back({h + "mlp.c_fc.bias", {16}});
  t.push_back({h + "mlp.c_proj.weight", {16, 4}});
  t.push_back({h + "mlp.c_proj.bias", {4}});
  for (StoredTensor& s : t) s.name = prefix + s.name;
  return t;
}

// Tensor k's element i: distinct everywhere, so that any misplaced value shows.
double value(size_t k, int64_t i) { return static_cast<double>(k) + 0.001 * static_cast<double>(i); }

void write_tensors(const std::string& path, const std::vector<StoredTensor>& tensors, size_t first_index = 0) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const StoredTensor& t : tensors) specs.push_back({t.name, DType::f32, t.shape});
  write_safetensors(path, specs, [&](size_t k) {
    HostTensor h = HostTensor::zeros(DType::f32, tensors[k].shape);
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, value(first_index + k, i));
    return h;
  });
}

std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_hf_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

const char* kGpt2Config = R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 6,
  "n_positions": 4, "n_embd": 4, "n_layer": 1, "n_head": 2, "n_inner": null, "activation_function": "gelu_new",
  "layer_norm_epsilon": 1e-05, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})";

std::string gpt2_dir(const std::string& name, const std::string& prefix, const std::string& config = kGpt2Config) {
  const std::string dir = fresh_dir(name);
  write_text(dir + "/config.json", config);
  write_tensors(dir + "/model.safetensors", gpt2_tensors(prefix));
  return dir;
}

// Each stored value where kiln's GPT must hold it: Conv1D weights transposed, the rest as stored.
void expect_gpt2_values(const models::CausalLM& model, const std::string& prefix) {
  std::map<std::string, HostTensor> params;
  for (const auto& [name, p] : model.named_parameters()) params[name] = p.to_host();
  const std::vector<StoredTensor> stored = gpt2_tensors(prefix);
  for (size_t k = 0; k < stored.size(); ++k) {
    std::string name = stored[k].name;
    if (name.rfind("transformer.", 0) != 0) name = "transformer." + name;
    ASSERT_TRUE(params.count(name)) << name;
    const HostTensor& p = params[name];
    const bool conv1d = name.find("c_attn.weight") != std::string::npos ||
                        name.find("c_proj.weight") != std::string::npos || name.find("c_fc.weight") != std::string::npos;
    const Shape& s = stored[k].shape;
    for (int64_t i = 0; i < p.numel(); ++i) {
      // kiln's element i of [out, in] is stored element (i % in) * out + i / in of [in, out].
      const int64_t j = conv1d ? (i % s[0]) * s[1] + i / s[0] : i;
      ASSERT_FLOAT_EQ(static_cast<float>(p.get(i)), static_cast<float>(value(k, j))) << name << " element " << i;
    }
  }
}

TEST(HfModel, Gpt2Conv1DWeightsArriveTransposed) {
  HfImport imported = import_hf_model(gpt2_dir("gpt2", "transformer."));
  EXPECT_EQ(imported.model->architecture(), "gpt");
  expect_gpt2_values(*imported.model, "transformer.");
}

TEST(HfModel, ConvertingStreamsTheSameWeightsFileAsLoadingAndSaving) {
  const std::string dir = gpt2_dir("gpt2_convert", "transformer.");
  const std::string path = dir + "/converted.h5";
  HfImport converted = convert_hf_model(dir, path);
  // The converted model has empty parameters (names, shapes and config only): zeros.
  for (const auto& [name, p] : converted.model->named_parameters()) {
    const HostTensor h = p.to_host();
    for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.get(i), 0.0) << name;
  }
  expect_gpt2_values(*load_model(path), "transformer.");
}

TEST(HfModel, Gpt2ModelCheckpointsWithoutPrefixAndWithBuffersImport) {
  // GPT2Model's names (the official "gpt2" checkpoint) and its causal-mask buffer.
  const std::string dir = fresh_dir("gpt2_bare");
  write_text(dir + "/config.json", kGpt2Config);
  std::vector<StoredTensor> t = gpt2_tensors("");
  t.push_back({"h.0.attn.bias", {1, 1, 4, 4}});
  write_tensors(dir + "/model.safetensors", t);
  HfImport imported = import_hf_model(dir);
  EXPECT_EQ(imported.skipped, std::vector<std::string>{"h.0.attn.bias"});
  expect_gpt2_values(*imported.model, "");
}

TEST(HfModel, ShardsListedByTheIndexImportLikeOneFile) {
  const std::string dir = fresh_dir("gpt2_shards");
  write_text(dir + "/config.json", kGpt2Config);
  const std::vector<StoredTensor> all = gpt2_tensors("transformer.");
  const std::vector<StoredTensor> first(all.begin(), all.begin() + 7), second(all.begin() + 7, all.end());
  write_tensors(dir + "/model-00001-of-00002.safetensors", first, 0);
  write_tensors(dir + "/model-00002-of-00002.safetensors", second, 7);
  std::string map;
  for (size_t k = 0; k < all.size(); ++k)
    map += std::string(k ? ", " : "") + "\"" + all[k].name + "\": \"model-0000" + (k < 7 ? "1" : "2") + "-of-00002.safetensors\"";
  write_text(dir + "/model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {" + map + "}}");
  HfImport imported = import_hf_model(dir);
  EXPECT_EQ(imported.files.size(), 2u);
  expect_gpt2_values(*imported.model, "transformer.");
  // A tensor the index places in the wrong shard is an error naming both.
  const std::string wrong = std::string(R"({"weight_map": {)") + "\"transformer.wte.weight\": \"model-00002-of-00002.safetensors\"}}";
  write_text(dir + "/model.safetensors.index.json", wrong);
  expect_error([&] { import_hf_model(dir); }, {"model-00002-of-00002.safetensors", "no tensor 'transformer.wte.weight'"});
}

TEST(HfModel, MissingUnexpectedAndMisshapenTensorsAreRefusedByName) {
  const std::string dir = gpt2_dir("gpt2_bad", "transformer.");
  std::vector<StoredTensor> t = gpt2_tensors("transformer.");
  t.erase(t.begin() + 1);  // wpe
  write_tensors(dir + "/model.safetensors", t);
  expect_error([&] { import_hf_model(dir); }, {"not stored", "transformer.wpe.weight"});
  t = gpt2_tensors("transformer.");
  t.push_back({"transformer.extra.weight", {2}});
  write_tensors(dir + "/model.safetensors", t);
  expect_error([&] { import_hf_model(dir); }, {"model.safetensors", "'transformer.extra.weight'", "unexpected"});
  t = gpt2_tensors("transformer.");
  t[8].shape = Shape{12, 4};  // c_attn in kiln's own [out, in] layout
  write_tensors(dir + "/model.safetensors", t);
  expect_error([&] { import_hf_model(dir); }, {"'transformer.h.0.attn.c_attn.weight'", "[12, 4]", "needs [4, 12]", "Conv1D"});
  // A stored lm_head that differs from the embedding it is tied to.
  t = gpt2_tensors("transformer.");
  t.push_back({"lm_head.weight", {6, 4}});
  write_tensors(dir + "/model.safetensors", t);
  expect_error([&] { import_hf_model(dir); }, {"'lm_head.weight' differs from 'transformer.wte.weight'"});
  fs::remove(dir + "/model.safetensors");
  expect_error([&] { import_hf_model(dir); }, {"neither model.safetensors nor model.safetensors.index.json"});
}

TEST(HfModel, SettingsKilnDoesNotImplementAreRefusedByName) {
  std::string config = kGpt2Config;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string c = config;
    c.replace(c.find(from), from.size(), to);
    return c;
  };
  const std::string dir = gpt2_dir("gpt2_settings", "transformer.");
  const std::string cfg = dir + "/config.json";
  for (const auto& [edit, named] : std::vector<std::pair<std::string, std::string>>{
           {with("\"gelu_new\"", "\"relu\""), "activation_function = \"relu\""},
           {with("\"attn_pdrop\": 0.0", "\"attn_pdrop\": 0.1"), "attn_pdrop"},
           {with("GPT2LMHeadModel", "MistralForCausalLM"), "'MistralForCausalLM' is not one kiln imports"},
           {with("\"n_embd\": 4", "\"n_embd\": \"four\""), "'n_embd' is \"four\", not a number"}}) {
    write_text(cfg, edit);
    expect_error([&] { import_hf_model(dir); }, {cfg, named});
  }
  // GPT-2's n_inner and layer_norm_epsilon become the model's MLP width and LayerNorm epsilon.
  std::string wider = with("\"n_inner\": null", "\"n_inner\": 8");
  wider.replace(wider.find("1e-05"), 5, "1e-06");
  write_text(cfg, wider);
  const ModelSpec gpt = read_hf_config(dir);
  EXPECT_EQ(gpt.attributes.get("ffn_hidden"), 8.0);
  EXPECT_EQ(gpt.attributes.get("norm_eps"), 1e-6);
  const std::string llama = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 6, "max_position_embeddings": 4,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 4, "intermediate_size": 8)";
  for (const auto& [extra, named] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "hidden_act": "gelu"})", "hidden_act = \"gelu\""},
           {R"(, "sliding_window": 4096})", "sliding_window"},
           {R"(, "head_dim": 4})", "head_dim = 4"},
           {R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})", "rope scaling of type 'yarn'"},
           {R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})", "llama3 rope scaling without its low_freq_factor"}}) {
    write_text(cfg, llama + extra);
    expect_error([&] { read_hf_config(dir); }, {cfg, named});
  }
  write_text(cfg, llama + R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "mlp_bias": true})");
  const ModelSpec spec = read_hf_config(dir);
  EXPECT_EQ(spec.architecture, "llama");
  EXPECT_EQ(spec.attributes.get("rope_theta"), 500000.0);
  EXPECT_EQ(spec.attributes.get("rope_scaling_factor"), 32.0);
  EXPECT_EQ(spec.attributes.get("mlp_bias"), 1.0);
  EXPECT_EQ(spec.attributes.get("n_kv_head"), 1.0);
}

// A tokenizer.json kiln does not run leaves the weights imported and says why; one it runs joins
// them (Llama 3's post-processor Sequence included); an export never leaves stale files beside
// its own; deeply nested JSON is refused before it is parsed.
TEST(HfModel, TokenizerJsonBesideTheWeights) {
  const std::string dir = gpt2_dir("gpt2_tokenizer", "transformer.");
  const std::string json = BpeModel::from_merges({}).hf_tokenizer_json();  // the 256 bytes, no merges
  write_text(dir + "/tokenizer.json", [&] {
    std::string j = json;
    j.replace(j.find("\"normalizer\": null"), 18, "\"normalizer\": {\"type\": \"NFC\"}");
    return j;
  }());
  HfImport imported = import_hf_model(dir);  // a 6-token model: a 256-byte tokenizer would not fit
  EXPECT_FALSE(imported.tokenizer);
  EXPECT_NE(imported.tokenizer_note.find("normalizer (NFC) is not supported"), std::string::npos)
      << imported.tokenizer_note;
  write_text(dir + "/tokenizer.json", json);
  expect_error([&] { import_hf_model(dir); }, {"tokenizer.json' has ids up to 255", "vocab_size is 6"});
  // Llama 3's post-processor form, on a model whose vocabulary holds the bytes.
  std::string sequence = json;
  sequence.replace(sequence.find("\"post_processor\": null"), 22,
                   R"("post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel"}, )"
                   R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "A", "type_id": 0}}, )"
                   R"({"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"A": {"id": "A", "ids": [65]}}}]})");
  const auto t = HfBpeTokenizer::from_json(sequence, "sequence");
  EXPECT_EQ(t->encode("b"), (std::vector<int32_t>{65, 98}));
  // Export refuses a directory whose files it would leave stale.
  const std::string out = fresh_dir("gpt2_export_stale");
  write_text(out + "/model.safetensors.index.json", "{}");
  expect_error([&] { export_hf_model(*imported.model, out, DType::f32); }, {"sharded checkpoint"});
  fs::remove(out + "/model.safetensors.index.json");
  write_text(out + "/tokenizer.json", "{}");
  expect_error([&] { export_hf_model(*imported.model, out, DType::f32); }, {"tokenizer.json", "would not replace"});
  write_text(dir + "/config.json", "{\"n_embd\": " + std::string(200, '[') + std::string(200, ']') + "}");
  expect_error([&] { read_hf_config(dir); }, {"config.json", "nested deeper than 64"});
}

TEST(HfModel, Llama3RopeScalingKeepsDividesAndInterpolatesItsBands) {
  // head size 8, theta 500, original context 8, factors 1 and 4: wavelengths 2 pi 500^(i/4) =
  // 6.3, 29.7, 140, 664; kept below 8 / 4 = 2 (none), divided above 8 / 1 (the last three),
  // interpolated between (the first: s = (8 / 6.28 - 1) / 3).
  const nn::RopeScaling s{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 8};
  const std::vector<double> plain = nn::rope_frequencies(8, 500), scaled = nn::rope_frequencies(8, 500, s);
  ASSERT_EQ(scaled.size(), 4u);
  const double smooth = (8 / (2 * M_PI / plain[0]) - 1) / 3;
  EXPECT_NEAR(scaled[0], (1 - smooth) * plain[0] / 8 + smooth * plain[0], 1e-15);
  for (size_t i = 1; i < 4; ++i) EXPECT_NEAR(scaled[i], plain[i] / 8, 1e-15);
  // A large original context keeps every frequency.
  const nn::RopeScaling wide{.factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_position = 1 << 20};
  const std::vector<double> kept = nn::rope_frequencies(8, 500, wide);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(kept[i], plain[i]) << i;
}

}  // namespace
}  // namespace kiln
