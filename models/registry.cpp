// The registered architectures: their config attributes (with the ranges a file's values must
// lie in) and constructors.
#include <kiln/models/gpt.hpp>
#include <kiln/models/llama.hpp>

namespace kiln::models {

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> list = [] {
    const AttributeSpec size_vocab{"vocab_size"}, size_block{"block_size"}, size_layers{"n_layer"},
        size_heads{"n_head"}, size_embd{"n_embd"};
    Architecture gpt{
        "gpt",
        "GPT-2 (learned positions, LayerNorm, GELU MLP, tied lm_head; nanoGPT names)",
        {size_vocab, size_block, size_layers, size_heads, size_embd, AttributeSpec{"dropout", false, 0, 1, true, 0.0},
         // GPT-2's n_inner and layer_norm_epsilon: format 4's (ffn_hidden 0 means 4 n_embd).
         AttributeSpec{"ffn_hidden", true, 0, 2147483648.0, true, 0, 4},
         AttributeSpec{"norm_eps", false, 0, 1, true, 1e-5, 4}},
        [](const ModelAttributes& a) -> std::unique_ptr<CausalLM> {
          return std::make_unique<GPT>(GPTConfig::from_attributes(a));
        }};
    Architecture llama{"llama",
                       "Llama (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU; Hugging Face names)",
                       {size_vocab, size_block, size_layers, size_heads, AttributeSpec{"n_kv_head"}, size_embd,
                        AttributeSpec{"ffn_hidden"}, AttributeSpec{"rope_theta", false, 1.0000001, 1e12},
                        AttributeSpec{"norm_eps", false, 0, 1}, AttributeSpec{"tie_embeddings", true, 0, 2},
                        // Hugging Face's attention_bias and mlp_bias, and llama3 rope scaling (a
                        // factor of 0: none; see LlamaConfig): format 4's, absent from older files.
                        AttributeSpec{"attention_bias", true, 0, 2, true, 0, 4},
                        AttributeSpec{"mlp_bias", true, 0, 2, true, 0, 4},
                        AttributeSpec{"rope_scaling_factor", false, 0, 1e6, true, 0, 4},
                        AttributeSpec{"rope_low_freq_factor", false, 0, 1e6, true, 1, 4},
                        AttributeSpec{"rope_high_freq_factor", false, 0, 1e6, true, 4, 4},
                        AttributeSpec{"rope_original_max_position", true, 1, 2147483648.0, true, 8192, 4}},
                       [](const ModelAttributes& a) -> std::unique_ptr<CausalLM> {
                         return std::make_unique<Llama>(LlamaConfig::from_attributes(a));
                       }};
    return std::vector<Architecture>{gpt, llama};
  }();
  return list;
}

}  // namespace kiln::models
