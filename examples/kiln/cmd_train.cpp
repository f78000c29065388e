// `kiln train`: trains a GPT on a text corpus (default: Debian's fortunes), saves its weights
// with the tokenizer, and prints a sample.
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <optional>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/core/device.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/train/atomic_file.hpp>
#include <kiln/train/checkpoint.hpp>
#include <kiln/train/sample.hpp>
#include <kiln/train/token_file.hpp>
#include <kiln/train/trainer.hpp>
#include <kiln/train/weights.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

int cmd_train(const std::vector<std::string>& argv) {
  Args a(argv,
         with_tune_flag(with_target_flags(with_precision_flag(with_thread_flag(with_model_flags(
             {{"data", "text file or directory (default: /usr/share/games/fortunes)"},
              {"out", "weights file to write (default: model.h5)"},
              {"metrics",
               "metrics log, JSON lines of every step and validation (default: beside --out, model.metrics.jsonl; "
               "`kiln plot` draws it)"},
              {"checkpoint", "checkpoint file, written every --ckpt-every steps and at the end"},
              {"ckpt-every", "steps between checkpoints (default 500)"},
              {"resume", "continue from this checkpoint (its config and tokenizer win)"},
              {"init-from",
               "start from these weights: a kiln weights file or a Hugging Face model directory (`kiln import` "
               "reads it); the architecture, config and tokenizer are the file's, model flags must agree"},
              {"batch", "sequences per step (default 16; under mpirun, over all ranks together)"},
              {"grad-accum",
               "run each rank's share of the batch as N micro-batches within the step, gradients added (default "
               "1)"},
              {"steps", "training steps (default 2000)"},
              {"stop-at",
               "stop after this step with a checkpoint, the schedule still spanning --steps (a job's time slice; "
               "--resume goes on, with any number of ranks)"},
              {"lr", "peak learning rate (default 2e-3)"},
              {"warmup", "warmup steps (default 100)"},
              {"dropout", "dropout probability (default 0)"},
              {"tokenizer", "char (default), byte or bpe (byte-level BPE learned on the corpus)"},
              {"bpe-vocab", "bpe: vocabulary size, 256 bytes + merges (default 512)"},
              {"tokens",
               "train on a pre-tokenized file instead of text: flat little-endian token ids (nanoGPT's train.bin) or "
               "llm.c's format; needs --vocab-size"},
              {"token-dtype", "--tokens: uint16 (default) or uint32 (an llm.c header says which itself)"},
              {"seed", "seed for initialization, batches and sampling (default 1337)"},
              {"eval-every", "steps between validation losses (default 250)"},
              {"sample-tokens", "tokens of the sample printed at the end (default 300; 0: none)"},
              {"device",
               "auto (default), cpu, cuda or sim (the CUDA back end on the SIMT simulator: slow, no GPU needed)"},
              {"collectives",
               "data parallel: auto (default: on GPUs NCCL where it loads), nccl or host (GPUs); noop (CPU): every "
               "all-reduce a local no-op, the baseline of the exposed communication time"},
              {"shard-optimizer",
               "data parallel: each rank updates and keeps AdamW's moments for 1/N of the parameters (ZeRO-1: "
               "gradients reduce-scattered, parameters all-gathered); checkpoints stay whole"},
              {"bucket-mb",
               "data parallel: gradients averaged in buckets of at most this many MiB, each started as soon as the "
               "backward has made it (default 25)"},
              {"stats",
               "log each step's kernels (forward/backward/update and recomputing), bytes, the bytes saved for the "
               "backward, host time and peak memory"},
              {"deterministic",
               "GPU steps without float atomics, CPU steps at a fixed thread count: a run (and a "
               "resumed run) repeats bit for bit"},
              {"no-trace", "record every step anew instead of recording it once and replaying it"},
              {"skip-non-finite",
               "skip (and count) a step whose loss or gradient norm is not finite instead of stopping, as "
               "PyTorch's GradScaler; 10 in a row still stop"}},
             true))))),
         "usage: kiln train [options]\n\nTrains a GPT (GPT-2 architecture) or a Llama (--model llama) with AdamW on a "
         "text corpus (char, byte or BPE tokens)\nor on a pre-tokenized token file.",
         with_target_switches(
             with_model_switches({"stats", "deterministic", "no-trace", "skip-non-finite", "shard-optimizer"})));
  if (a.help()) {
    a.print_help();
    return 0;
  }
  apply_thread_flag(a);
  apply_precision_flag(a);
  // Launched by mpirun/srun as one of several processes: data parallel over them. Rank 0 logs,
  // writes the metrics, checkpoints and weights; the others log warnings and errors only.
  join_ranks();
  if (world().size() > 1) {
    spdlog::info("data parallel: {} ranks through {}; each step's batch of {} sequences split over them",
                 world().size(), world().backend(), a.integer("batch", 16, 1));
  }
  const DeviceSelection device = parse_device(a.str("device", "auto"));
  Engine::current().set_device(device.device, device.runtime);
  apply_target_flags(a);
  const TuneMode tune = apply_tune_flag(a, device.runtime, a.has("stats"));
  apply_collectives_flag(a, device, a.has("shard-optimizer"));
  Engine::current().set_deterministic(a.has("deterministic"));
  spdlog::info("device: {}{}, {} matmuls", device_name(device.device), device.simulated() ? " (simulated)" : "",
               precision_name(Engine::current().precision()));
  if (device.device != Device::CUDA && Engine::current().precision() == Precision::bf16)
    log_cpu_bf16(Engine::current().target(), Precision::bf16);
  const uint64_t seed = static_cast<uint64_t>(a.integer("seed", 1337));
  const std::string tokenizer_kind = a.str("tokenizer", "char");
  if (tokenizer_kind != "char" && tokenizer_kind != "byte" && tokenizer_kind != "bpe")
    throw Error("--tokenizer must be char, byte or bpe, received '" + tokenizer_kind + "'");
  const int64_t bpe_vocab = a.integer("bpe-vocab", 512, 256);
  const bool pretokenized = a.has("tokens");
  const std::string init_from = a.str("init-from", "");
  if (!init_from.empty() && a.has("resume"))
    throw Error("--init-from starts a run from given weights, --resume continues one from its checkpoint: not both");
  if (!init_from.empty() && a.has("tokenizer"))
    throw Error("--init-from takes the tokenizer of its weights: it takes no --tokenizer");
  if (pretokenized && (a.has("data") || a.has("tokenizer")))
    throw Error("--tokens is pre-tokenized data: it takes no --data or --tokenizer");
  if (!pretokenized && !a.has("resume") && init_from.empty() && a.has("vocab-size"))
    throw Error("--vocab-size applies to --tokens only (a text corpus's tokenizer gives the vocabulary)");
  if (pretokenized && !a.has("resume") && init_from.empty() && !a.has("vocab-size"))
    throw Error("--tokens needs --vocab-size: a token file does not say how many ids its tokenizer has");
  const std::string token_dtype = a.str("token-dtype", "uint16");
  if (token_dtype != "uint16" && token_dtype != "uint32")
    throw Error("--token-dtype must be uint16 or uint32, received '" + token_dtype + "'");
  // Every option is checked before the corpus is read: a bad flag is reported as such, even
  // when the corpus is missing or large.
  TrainOptions o;
  o.batch = a.integer("batch", 16, 1);
  o.grad_accum = a.integer("grad-accum", 1, 1);
  o.shard_optimizer = a.has("shard-optimizer");
  if (o.shard_optimizer && a.str("collectives", "auto") == "noop")
    throw Error(
        "--shard-optimizer with --collectives noop: the moments a checkpoint gathers would be this rank's "
        "alone (time the collectives with kiln bench under mpirun)");
  o.bucket_bytes = static_cast<size_t>(a.real("bucket-mb", 25.0, 1.0 / 1024, 1 << 20) * (1 << 20));
  o.steps = a.integer("steps", 2000, 1);
  o.stop_at = a.integer("stop-at", 0, 0);
  const int64_t sample_tokens = a.integer("sample-tokens", 300, 0);
  o.lr = a.real("lr", 2e-3, 0.0, std::numeric_limits<double>::infinity(), false);
  o.min_lr = o.lr / 10;
  o.warmup = a.integer("warmup", 100, 0);
  o.eval_interval = a.integer("eval-every", 250, 0);
  o.checkpoint = a.str("checkpoint", "");
  o.checkpoint_interval = a.integer("ckpt-every", 500, 0);
  o.stats = a.has("stats");
  o.traced = !a.has("no-trace");
  o.tune_first_step = tune == TuneMode::on;
  o.skip_non_finite = a.has("skip-non-finite");
  o.validate_before_training = !init_from.empty();
  const std::string out = a.str("out", "model.h5");
  o.metrics_log = a.str("metrics", std::filesystem::path(out).replace_extension(".metrics.jsonl").string());
  const double dropout = a.real("dropout", 0.0, 0.0, 1.0);
  if (!a.has("resume") && init_from.empty()) check_model_flags(a);
  // The tokenizer (none for pre-tokenized data), the model, then the data over its vocabulary.
  std::optional<Tokenizer> tok;
  std::string text;
  std::unique_ptr<models::CausalLM> initial;  // --init-from: the model, its weights loaded
  if (!init_from.empty()) {
    // On a token file the tokenizer (where the weights have one) goes on into checkpoints, the
    // weights written and the closing sample.
    initial = load_initial_model(init_from, a, dropout, tok);
    if (!tok && !pretokenized)
      throw Error("'" + init_from + "' holds no tokenizer kiln reads: train it on pre-tokenized data with --tokens");
    if (!pretokenized) text = read_corpus(a.str("data", kDefaultCorpus));
  } else if (a.has("resume")) {
    tok = read_checkpoint_tokenizer_if_any(a.str("resume", ""));
  } else if (!pretokenized) {
    text = read_corpus(a.str("data", kDefaultCorpus));
    if (text.empty()) throw Error("the corpus '" + a.str("data", kDefaultCorpus) + "' is empty: nothing to train on");
    try {  // a corpus that is not UTF-8 is an error naming it
      if (tokenizer_kind == "bpe") {
        const auto t0 = std::chrono::steady_clock::now();
        tok = Tokenizer::bpe(BpeModel::train(text, bpe_vocab));
        spdlog::info("bpe: {} tokens learned on the corpus in {:.1f} s", tok->vocab_size(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      } else {
        tok = tokenizer_kind == "byte" ? Tokenizer::byte_level() : Tokenizer::char_level(text);
      }
    } catch (const Error& e) {
      throw Error("the corpus '" + a.str("data", kDefaultCorpus) + "': " + e.what());
    }
  }
  manual_seed(seed);
  std::unique_ptr<models::CausalLM> model_ptr = initial ? std::move(initial)
                                                : a.has("resume")
                                                    ? read_checkpoint_model(a.str("resume", ""))
                                                    : model_from_flags(a, tok ? tok->vocab_size() : 0, dropout);
  models::CausalLM& model = *model_ptr;
  std::unique_ptr<TextDataset> data_ptr;
  if (pretokenized) {
    data_ptr = std::make_unique<TextDataset>(
        TokenFile::open(a.str("tokens", ""), token_dtype == "uint32" ? TokenDType::U32 : TokenDType::U16),
        model.vocab_size(), seed);
  } else {
    if (!tok) throw Error("checkpoint '" + a.str("resume", "") + "' holds no tokenizer: resume it with --tokens");
    if (text.empty()) text = read_corpus(a.str("data", kDefaultCorpus));  // resuming a run on text
    data_ptr = std::make_unique<TextDataset>(tok->encode(text), seed);
  }
  const TextDataset& data = *data_ptr;
  spdlog::info("data: {} tokens ({} train, {} validation), vocabulary {}", data.train_tokens() + data.val_tokens(),
               data.train_tokens(), data.val_tokens(), model.vocab_size());
  const models::ModelAttributes attrs = model.attributes();
  spdlog::info("model: {}, {} layers, {} heads, {} wide, block {}: {} parameters", model.architecture(),
               attrs.get_int("n_layer"), attrs.get_int("n_head"), attrs.get_int("n_embd"), model.block_size(),
               model.num_parameters());
  Trainer trainer = tok ? Trainer(model, data, *tok, seed, o) : Trainer(model, data, seed, o);
  if (a.has("resume")) trainer.resume(a.str("resume", ""));
  TrainResult r = trainer.run();
  if (world().rank() != 0) return 0;  // rank 0 writes the weights and samples
  save_weights(out, model, tok ? &*tok : nullptr);
  spdlog::info("final validation loss {:.4f} nats/token; weights written to {}; metrics in {} (`kiln plot {}`){}",
               r.val_loss, out, o.metrics_log, o.metrics_log,
               r.skipped_steps > 0 ? fmt::format("; {} steps skipped (non-finite)", r.skipped_steps) : "");
  if (tok && tok->hf_tokenizer_json()) {  // the tokenizer for Hugging Face tools too
    const std::string json = std::filesystem::path(out).replace_extension(".tokenizer.json").string();
    write_file_atomically(json, *tok->hf_tokenizer_json());
    spdlog::info("tokenizer written to {} (Hugging Face tokenizers' format)", json);
  }
  if (!tok || sample_tokens == 0) return 0;  // no tokenizer: nothing to sample text with
  model.eval();
  SampleOptions so;
  so.seed = seed;
  so.tokens = sample_tokens;
  so.temperature = 0.8;
  std::printf("---- sample ----\n%s\n----------------\n", sample_text(model, *tok, "\n", so).c_str());
  return 0;
}

}  // namespace kiln::cli
