// Fuzz target: a checkpoint (train/checkpoint.hpp) read as `kiln train --resume` reads it:
// config and tokenizer, then weights, Adam moments, step and RNG state into a model of that
// config.
#include <cmath>

#include <kiln/models/gpt.hpp>
#include <kiln/train/adamw.hpp>
#include <kiln/train/checkpoint.hpp>

#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  const std::string& path = fuzz::input_file(data, size);
  return fuzz::refuse_or_accept([&] {
    const models::GPTConfig c = read_checkpoint_config(path);
    const Tokenizer tok = read_checkpoint_tokenizer(path);
    if (c.parameter_count() > fuzz::kMaxFuzzParameters) return;
    models::GPT model(c);
    optim::AdamW opt(model.parameters(), {});
    const CheckpointState s = load_checkpoint(path, model, opt);
    fuzz::require(s.step >= 0 && opt.steps() >= 0, "a loaded step count is not negative");
    for (const HostTensor& v : opt.whole_moments().exp_avg_sq)
      for (int64_t i = 0; i < v.numel(); ++i)
        fuzz::require(v.get(i) >= 0 && std::isfinite(v.get(i)), "loaded second moments are >= 0");
    (void)tok;
  });
}
