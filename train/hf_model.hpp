// Hugging Face model directories in and out: config.json + model.safetensors (or shards listed by
// model.safetensors.index.json's weight_map) for transformers' GPT2LMHeadModel and
// LlamaForCausalLM, as kiln's "gpt" and "llama" models.
//
// GPT-2: kiln's GPT uses nanoGPT's names, which are Hugging Face's; its Linear weights are [out, in]
// where GPT-2's Conv1D weights are stored [in, out], so c_attn, c_proj and c_fc weights are
// transposed both ways. The attn.bias / attn.masked_bias buffers are not parameters (skipped), and
// lm_head is tied to wte (a stored lm_head.weight must equal it). Llama: the names are the same;
// tied models store no lm_head.weight, and rotary_emb.inv_freq buffers are skipped.
// Config settings kiln does not implement (another activation or head size, rope scaling other
// than llama3's, sliding windows, ...) are refused by name, never approximated.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kiln/train/weights.hpp>

namespace kiln {

// The kiln architecture and attributes of DIR/config.json (errors name the file and the setting).
ModelSpec read_hf_config(const std::string& dir);

struct HfImport {
  std::unique_ptr<models::CausalLM> model;
  // DIR/tokenizer.json, where present and a byte-level BPE (train/hf_tokenizer.hpp); a tokenizer of
  // another kind is not imported and `tokenizer_note` says why.
  std::optional<Tokenizer> tokenizer;
  std::string tokenizer_note;
  std::vector<std::string> files;    // the safetensors files read
  std::vector<std::string> skipped;  // stored tensors that are not parameters (buffers, a tied lm_head)
};
// Builds the model DIR describes and loads its weights (converted to f32 from F32, BF16, F16 or
// F64). Strict: every parameter must be stored, every stored tensor must be a parameter or a known
// buffer, shapes must match; errors name the file and the tensor. `progress(done, total)` is
// called after each tensor. The file's pages are handed back as they are read, so the import
// holds the model plus about one tensor.
HfImport import_hf_model(const std::string& dir, const std::function<void(size_t, size_t)>& progress = {});

// The same, streamed into a kiln weights file at `out_path` (written atomically) without loading
// the model: its parameters are empty (nn::EmptyParameters) and one tensor at a time is read,
// converted and written, so the import holds about the file being written plus one tensor. The
// returned model has the architecture and config but zeros for values.
HfImport convert_hf_model(const std::string& dir, const std::string& out_path,
                          const std::function<void(size_t, size_t)>& progress = {});

// Writes DIR/config.json and DIR/model.safetensors (tensors in `dtype`: f32 or bf16) that
// transformers' AutoModelForCausalLM.from_pretrained(DIR) loads with no missing, unexpected or
// mismatched keys, and DIR/tokenizer.json for a BPE tokenizer (kiln's or an imported one), which
// AutoTokenizer.from_pretrained(DIR) loads. DIR is created if needed; each file is written atomically.
void export_hf_model(const models::CausalLM& model, const std::string& dir, DType dtype,
                     const Tokenizer* tokenizer = nullptr);

// One parameter's place in a Hugging Face checkpoint: kiln's name, the stored name, and whether
// the stored tensor is the transpose (GPT-2's Conv1D [in, out] weights). Exposed for the tests.
struct HfTensorName {
  std::string kiln;
  std::string hf;
  bool transposed = false;
};
std::vector<HfTensorName> hf_tensor_names(const models::CausalLM& model);

}  // namespace kiln
