// Fuzz target: a batch file (train/batch_file.hpp) for a GPT of vocabulary 65 and block 16, as
// `kiln dump --batch` reads it; an accepted batch then runs forward through the model.
#include <kiln/models/gpt.hpp>
#include <kiln/train/batch_file.hpp>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  static const models::GPTConfig config{.vocab_size = 65, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 8};
  static models::GPT model(config);
  const std::string& path = fuzz::input_file(data, size);
  return fuzz::refuse_or_accept([&] {
    const TokenBatch b = read_batch_file(path, config.block_size, config.vocab_size);
    if (b.x.numel() > 4096) return;  // a harness limit on the forward pass, not on the reader
    const double loss = model.loss(Tensor::from_host(b.x), Tensor::from_host(b.y)).item();
    fuzz::require(std::isfinite(loss), "the loss of an accepted batch is finite");
  });
}
