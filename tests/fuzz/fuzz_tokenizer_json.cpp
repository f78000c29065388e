// Fuzz target: a Hugging Face tokenizer.json (train/hf_tokenizer.hpp), as `kiln import` reads it
// and as a weights file's tokenizer/json holds it. An accepted tokenizer then encodes a text of
// mixed scripts, whitespace and special-token look-alikes, and every id it gives decodes.
#include <kiln/train/hf_tokenizer.hpp>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const std::string text(reinterpret_cast<const char*>(data), size);
  return fuzz::refuse_or_accept([&] {
    if (!HfBpeTokenizer::is_byte_level_bpe(text)) return;
    const auto tok = HfBpeTokenizer::from_json(text, "fuzz input");
    const std::string sample = "the cat's naïve café 日本語 x2 1234 <|endoftext|>\t\n\n  end";
    const std::vector<int32_t> ids = tok->encode(sample);
    for (int32_t id : ids) fuzz::require(id >= 0 && id < tok->vocab_size(), "ids lie inside the vocabulary");
    tok->decode(ids);
  });
}
