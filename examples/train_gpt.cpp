// The code a user copies to start: build a small GPT, train it a few hundred steps on a text
// file with AdamW, save its weights, and print a sample.
//   ./train_gpt [text file or directory] [steps]
#include <spdlog/spdlog.h>

#include <kiln/train/adamw.hpp>
#include <kiln/train/dataset.hpp>
#include <kiln/train/sample.hpp>
#include <kiln/train/schedule.hpp>
#include <kiln/train/weights.hpp>

using namespace kiln;

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : kDefaultCorpus;
  int64_t steps = argc > 2 ? std::stoll(argv[2]) : 300;

  std::string text = read_corpus(path);
  Tokenizer tok = Tokenizer::char_level(text);
  TextDataset data(tok.encode(text), /*seed=*/1);

  manual_seed(1);
  models::GPTConfig config;
  config.vocab_size = tok.vocab_size();
  config.n_layer = 2;
  config.n_head = 4;
  config.n_embd = 128;
  config.block_size = 64;
  models::GPT model(config);

  optim::AdamWOptions adamw;
  adamw.weight_decay = 0.1;
  optim::AdamW opt(model.parameters(), adamw);

  for (int64_t step = 0; step < steps; ++step) {
    opt.set_lr(warmup_cosine_lr(step, 50, steps, 2e-3, 2e-4));
    Batch batch = data.train_batch(static_cast<uint64_t>(step), /*batch=*/16, config.block_size);
    Tensor loss = model.loss(batch.x, batch.y);  // records forward ops
    loss.backward();                             // records backward ops
    opt.step(/*max_grad_norm=*/1.0);             // records updates, runs the whole step
    if (step % 50 == 0 || step == steps - 1) spdlog::info("step {} loss {:.4f}", step, loss.item());
  }

  save_weights("gpt.h5", model, &tok);
  model.eval();
  std::printf("%s\n", sample_text(model, tok, "\n", SampleOptions{}).c_str());
  return 0;
}
