// `kiln train`: trains a GPT on a text corpus (default: Debian's fortunes), saves its weights
// with the tokenizer, and prints a sample.
#include <spdlog/spdlog.h>

#include <limits>

#include "args.hpp"
#include "circuit/ir/error.hpp"
#include "commands.hpp"
#include "core/device.hpp"
#include "core/engine.hpp"
#include "train/checkpoint.hpp"
#include "train/sample.hpp"
#include "train/trainer.hpp"
#include "train/weights.hpp"

namespace kiln::cli {

int cmd_train(const std::vector<std::string>& argv) {
  Args a(argv,
         with_thread_flag(with_model_flags(
             {{"data", "text file or directory (default: /usr/share/games/fortunes)"},
              {"out", "weights file to write (default: model.h5)"},
              {"checkpoint", "checkpoint file, written every --ckpt-every steps and at the end"},
              {"ckpt-every", "steps between checkpoints (default 500)"},
              {"resume", "continue from this checkpoint (its config and tokenizer win)"},
              {"batch", "sequences per step (default 16)"},
              {"steps", "training steps (default 2000)"},
              {"lr", "peak learning rate (default 2e-3)"},
              {"warmup", "warmup steps (default 100)"},
              {"dropout", "dropout probability (default 0)"},
              {"tokenizer", "char (default) or byte"},
              {"seed", "seed for initialization, batches and sampling (default 1337)"},
              {"eval-every", "steps between validation losses (default 250)"},
              {"device", "auto (default), cpu or cuda"},
              {"stats", "log each step's kernels (forward/backward/update), bytes, host time and peak memory"},
              {"deterministic",
               "GPU steps without float atomics, CPU steps at a fixed thread count: a run (and a "
               "resumed run) repeats bit for bit"},
              {"no-trace", "record every step anew instead of recording it once and replaying it"},
              {"skip-non-finite",
               "skip (and count) a step whose loss or gradient norm is not finite instead of stopping, as "
               "PyTorch's GradScaler; 10 in a row still stop"}},
             false)),
         "usage: kiln train [options]\n\nTrains a GPT (GPT-2 architecture) or a Llama (--model llama) with AdamW on a "
         "character- or byte-level corpus.",
         with_model_switches({"stats", "deterministic", "no-trace", "skip-non-finite"}));
  if (a.help()) {
    a.print_help();
    return 0;
  }
  apply_thread_flag(a);
  Device device = parse_device(a.str("device", "auto"));
  Engine::current().set_device(device);
  Engine::current().set_deterministic(a.has("deterministic"));
  spdlog::info("device: {}", device_name(device));
  const uint64_t seed = static_cast<uint64_t>(a.integer("seed", 1337));
  if (a.str("tokenizer", "char") != "char" && a.str("tokenizer", "char") != "byte")
    throw Error("--tokenizer must be char or byte");
  // Every option is checked before the corpus is read: a bad flag is reported as such, even
  // when the corpus is missing or large.
  TrainOptions o;
  o.batch = a.integer("batch", 16, 1);
  o.steps = a.integer("steps", 2000, 1);
  o.lr = a.real("lr", 2e-3, 0.0, std::numeric_limits<double>::infinity(), false);
  o.min_lr = o.lr / 10;
  o.warmup = a.integer("warmup", 100, 0);
  o.eval_interval = a.integer("eval-every", 250, 0);
  o.checkpoint = a.str("checkpoint", "");
  o.checkpoint_interval = a.integer("ckpt-every", 500, 0);
  o.stats = a.has("stats");
  o.traced = !a.has("no-trace");
  o.skip_non_finite = a.has("skip-non-finite");
  const double dropout = a.real("dropout", 0.0, 0.0, 1.0);
  if (!a.has("resume")) check_model_flags(a);
  std::string text = read_corpus(a.str("data", kDefaultCorpus));
  if (text.empty()) throw Error("the corpus '" + a.str("data", kDefaultCorpus) + "' is empty: nothing to train on");
  auto char_level = [&] {  // a corpus that is not UTF-8 is an error naming it
    try {
      return Tokenizer::char_level(text);
    } catch (const Error& e) {
      throw Error("the corpus '" + a.str("data", kDefaultCorpus) + "': " + e.what());
    }
  };
  Tokenizer tok = a.has("resume")                        ? read_checkpoint_tokenizer(a.str("resume", ""))
                  : a.str("tokenizer", "char") == "byte" ? Tokenizer::byte_level()
                                                         : char_level();
  TextDataset data(tok.encode(text), seed);
  spdlog::info("corpus: {} tokens ({} train, {} validation), vocabulary {}", data.train_tokens() + data.val_tokens(),
               data.train_tokens(), data.val_tokens(), tok.vocab_size());
  manual_seed(seed);
  std::unique_ptr<models::CausalLM> model_ptr =
      a.has("resume") ? read_checkpoint_model(a.str("resume", "")) : model_from_flags(a, tok.vocab_size(), dropout);
  models::CausalLM& model = *model_ptr;
  const models::ModelAttributes attrs = model.attributes();
  spdlog::info("model: {}, {} layers, {} heads, {} wide, block {}: {} parameters", model.architecture(),
               attrs.get_int("n_layer"), attrs.get_int("n_head"), attrs.get_int("n_embd"), model.block_size(),
               model.num_parameters());
  Trainer trainer(model, data, tok, seed, o);
  if (a.has("resume")) trainer.resume(a.str("resume", ""));
  TrainResult r = trainer.run();
  std::string out = a.str("out", "model.h5");
  save_weights(out, model, &tok);
  spdlog::info("final validation loss {:.4f} nats/token; weights written to {}{}", r.val_loss, out,
               r.skipped_steps > 0 ? fmt::format("; {} steps skipped (non-finite)", r.skipped_steps) : "");
  model.eval();
  SampleOptions so;
  so.seed = seed;
  so.tokens = 300;
  so.temperature = 0.8;
  std::printf("---- sample ----\n%s\n----------------\n", sample_text(model, tok, "\n", so).c_str());
  return 0;
}

}  // namespace kiln::cli
