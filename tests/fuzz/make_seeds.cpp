// Writes the fuzz targets' seed corpus (committed under tests/fuzz/corpus/<target>/): small
// valid inputs of each kind, so that mutations start from files kiln itself writes.
//   kiln_fuzz_seeds <corpus directory>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <kiln/core/engine.hpp>
#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/hdf5_file.hpp>
#include <kiln/train/hf_model.hpp>
#include <kiln/train/safetensors.hpp>
#include <kiln/train/weights.hpp>

namespace fs = std::filesystem;
using namespace kiln;

namespace {

models::GPTConfig tiny(int64_t vocab, int64_t layers) {
  return {.vocab_size = vocab, .block_size = 4, .n_layer = layers, .n_head = 2, .n_embd = 4};
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_fuzz_seeds <corpus directory>\n");
    return 2;
  }
  const fs::path root = argv[1];
  for (const char* t : {"weights", "weights_fields", "checkpoint", "batch", "tokenizer", "text", "safetensors",
                        "tokenizer_json"})
    fs::create_directories(root / t);
  manual_seed(3);
  const std::string corpus = "ab cab\nbca ✓\n";
  const Tokenizer chars = Tokenizer::char_level(corpus), bytes = Tokenizer::byte_level();

  models::GPT small(tiny(chars.vocab_size(), 1)), two_layers(tiny(chars.vocab_size(), 2)), byte_model(tiny(256, 1));
  save_weights((root / "weights/char_tokenizer.h5").string(), small, &chars);
  save_weights((root / "weights/no_tokenizer_2_layers.h5").string(), two_layers);
  save_weights((root / "weights/byte_tokenizer.h5").string(), byte_model, &bytes);

  optim::AdamW opt(small.parameters(), {});
  Tensor x = Tensor::from_ints({1, 2, 3, 0}, Shape{1, 4}), y = Tensor::from_ints({2, 3, 0, 1}, Shape{1, 4});
  small.loss(x, y).backward();
  opt.step(1.0);
  save_checkpoint((root / "checkpoint/after_one_step.h5").string(), small, opt, chars, {1, 7});

  h5::write_atomically((root / "batch/b2_t3.h5").string(), [](h5::File& f) {
    f.write("x", Tensor::from_ints({1, 2, 3, 4, 5, 6}, Shape{2, 3}).to_host());
    f.write("y", Tensor::from_ints({2, 3, 4, 5, 6, 64}, Shape{2, 3}).to_host());
  });

  write_text(root / "tokenizer/corpus", std::string("\x00", 1) + corpus);
  const int32_t vocab_and_ids[] = {10, 97, 98, 10003, 0, 1, 3, 2, 1};
  write_text(root / "tokenizer/vocab_and_ids",
             std::string("\x01", 1) + std::string(reinterpret_cast<const char*>(vocab_and_ids), sizeof vocab_and_ids));
  write_text(root / "tokenizer/bytes", std::string("\x02\xff\x00\x80", 4));

  // Edit lists for fuzz_weights_fields (its header gives the encoding): none; vocab_size set
  // to 5 (op 0, attribute 2, a small value); transformer/wte/weight replaced by f32 [5, 4] ones.
  write_text(root / "weights_fields/unchanged", "");
  write_text(root / "weights_fields/vocab_size_5", std::string("\x00\x02\x01\x05", 4));
  write_text(root / "weights_fields/wte_ones",
             std::string("\x05\x00\x00\x02\x05\x04\x00\x00\x80\x3f\x00\x00\x80\x3f", 14));

  write_text(root / "text/fortune", "Q: What's a cat's favourite color?\nA: Purrple.\n%\nÀ bientôt ✓\n");
  write_text(root / "text/short", "abcabcabcabcabcabcabcabc");
  // safetensors: every float dtype kiln reads and writes, metadata, a scalar and an empty tensor;
  // and a GPT's weights as `kiln export` writes them.
  HostTensor values = HostTensor::zeros(DType::f32, Shape{2, 3});
  for (int64_t i = 0; i < values.numel(); ++i) values.set(i, 0.5 * static_cast<double>(i) - 1);
  write_safetensors((root / "safetensors/dtypes.safetensors").string(),
                    {{"a", DType::f32, Shape{2, 3}}, {"b", DType::bf16, Shape{2, 3}}, {"c", DType::f16, Shape{2, 3}},
                     {"s", DType::f32, Shape{}}, {"e", DType::f32, Shape{0, 4}}},
                    [&](size_t i) {
                      return i < 3 ? values : i == 3 ? HostTensor::zeros(DType::f32, Shape{}) : HostTensor::zeros(DType::f32, Shape{0, 4});
                    },
                    {{"format", "pt"}});
  export_hf_model(small, (root / "safetensors/gpt").string(), DType::bf16);
  fs::rename(root / "safetensors/gpt/model.safetensors", root / "safetensors/gpt.safetensors");
  fs::remove_all(root / "safetensors/gpt");
  // tokenizer_json: kiln's own BPE as tokenizer.json (GPT-2's and Llama 3's kinds, made by Hugging
  // Face tokenizers, are committed beside it: gpt2.json, llama3.json).
  write_text(root / "tokenizer_json/kiln_bpe.json", BpeModel::train(corpus + corpus + "the the cat", 270).hf_tokenizer_json());
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
