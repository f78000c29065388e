// `kiln sample`, `kiln eval`, `kiln init`: commands over a weights file.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/circuit/prims/onednn_matmul.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/precision.hpp>
#include <kiln/models/llama.hpp>
#include <kiln/train/atomic_file.hpp>
#include <kiln/train/dataset.hpp>
#include <kiln/train/hf_model.hpp>
#include <kiln/train/sample.hpp>
#include <kiln/train/weights.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

namespace {
std::unique_ptr<models::CausalLM> load_model_for_inference(const std::string& path, const Args& a) {
  std::unique_ptr<models::CausalLM> model = load_model_as_flagged(path, a);
  model->eval();
  return model;
}

Tokenizer require_tokenizer(const std::string& path) {
  std::optional<Tokenizer> tok = load_tokenizer(path);
  if (!tok)
    throw Error("weights file '" + path +
                "' has no tokenizer (the model was not trained on text), so it cannot "
                "turn text into tokens");
  return *tok;
}
}  // namespace

std::map<std::string, std::string> with_model_flags(std::map<std::string, std::string> options, bool vocab_size) {
  options["model"] = "architecture: gpt (default) or llama";
  options["kv-heads"] = "llama: key/value heads, dividing --heads (default 2)";
  options["ffn-hidden"] = "llama: MLP hidden width (default 8/3 --embd rounded up to 32)";
  options["rope-theta"] = "llama: rotary embedding base (default 10000)";
  options["tie-embeddings"] = "llama: lm_head shares the token embedding";
  options["layers"] = "transformer blocks (default 4)";
  options["heads"] = "attention heads (default 4)";
  options["embd"] = "embedding width (default 128)";
  options["block"] = "context length (default 64)";
  if (vocab_size) options["vocab-size"] = "vocabulary size (default 65)";
  return options;
}

std::unique_ptr<models::CausalLM> load_model_as_flagged(const std::string& path, const Args& a) {
  LoadReport report;
  std::unique_ptr<models::CausalLM> model = kiln::load_model(path, {.strict = !a.has("non-strict")}, &report);
  if (!report.empty())
    std::fprintf(stderr, "kiln: loaded '%s' non-strictly (%s)\n", path.c_str(), report.str().c_str());
  return model;
}

std::set<std::string> with_model_switches(std::set<std::string> switches) {
  switches.insert("tie-embeddings");
  return switches;
}

std::map<std::string, std::string> with_thread_flag(std::map<std::string, std::string> options) {
  options["threads"] =
      "CPU threads, fixed (default: kiln chooses, fewer while other work holds cores; KILN_NUM_THREADS)";
  return options;
}

std::map<std::string, std::string> with_precision_flag(std::map<std::string, std::string> options) {
  options["precision"] =
      "f32 (default) or bf16: matmul operands cast to bf16, f32 accumulation; parameters, gradients, optimizer "
      "state, the loss and normalization stay f32";
  return options;
}

void apply_precision_flag(const Args& a) {
  try {
    Engine::current().set_precision(parse_precision(a.str("precision", "f32")));
  } catch (const Error& e) {
    throw Error(std::string("--precision: ") + e.what());
  }
}

std::map<std::string, std::string> with_target_flags(std::map<std::string, std::string> options) {
  options["matmul"] =
      "GPU matmul kernels' choices, KEY=VALUE,...: tile=128x128|128x256|192x256|auto|waves, stages=2|3|4, "
      "split-k=0|auto|2|3|4, wgmma=on|off, staged-stores=none|odd|all, products-first=on|off, tensor-copies=on|off, "
      "simt-tile=64|128, bf16-mma=on|off (default: per device and shape; docs/CLI.md)";
  options["cpu-bf16"] =
      "CPU bf16 products: rounded-f32 (operands rounded to bf16, held and multiplied in f32; the default without "
      "AMX) or onednn (stored in bf16, oneDNN's bf16 kernels: AMX or AVX512-BF16; CPUs with AVX-512; the default "
      "with AMX-BF16)";
  options["tf32"] = "GPU f32 matmuls on tf32 tensor cores (10-bit mantissas; default off, as PyTorch)";
  options["attention-path"] = "GPU bf16 attention on mma (default) or simt (FFMA) kernels";
  options["passes"] = "-NAME,...: passes switched off (`kiln prims` lists them), e.g. -fuse_attention";
  options["recompute"] =
      "what the backward computes again instead of keeping from the forward: none (the default on the GPU, "
      "where recomputation is untimed), auto (the default on the CPU: what costs no matmul: GELU outputs, layer "
      "norm outputs, dropout masks) or blocks (each transformer block from its input, matmuls and attention "
      "included)";
  options["memory-budget"] =
      "BYTES (K, M, G suffixes: KiB, MiB, GiB): the most workspace the step may take; kiln recomputes more, block "
      "by block, until it fits, and says so (an error states what the most recomputation needs)";
  options["wide-indices"] = "GPU: every kernel indexes with 64 bits (as tensors of 2^31 elements and more need)";
  options["no-cuda-graphs"] = "GPU: launch kernels one by one instead of replaying the step as a CUDA graph";
  options["no-overwrite"] =
      "CPU: every value in a buffer of its own (no output written over an input that dies at its op, no optimizer "
      "update written over the state it replaces): more workspace, the same results";
  options["poison-buffers"] =
      "CPU: fill buffers with NaN / -1 bytes before each op writes them (finds unwritten elements)";
  return options;
}

std::set<std::string> with_target_switches(std::set<std::string> switches) {
  switches.insert({"tf32", "wide-indices", "no-cuda-graphs", "no-overwrite", "poison-buffers"});
  return switches;
}

Target target_from_flags(const Args& a, Target t) {
  if (a.has("matmul")) t.matmul = parse_matmul_policy(a.str("matmul", ""));
  t.tf32 = a.has("tf32");
  t.wide_indices = a.has("wide-indices");
  if (a.has("attention-path")) t.attention = parse_attention_path(a.str("attention-path", ""));
  if (a.has("cpu-bf16")) {
    t.cpu_bf16 = parse_cpu_bf16(a.str("cpu-bf16", ""));
    if (t.cpu_bf16 == CpuBf16Products::onednn && !OneDnnMatmul::available(DType::bf16))
      throw Error(
          "--cpu-bf16 onednn: oneDNN has no bf16 matmul on this CPU (its bf16 kernels need AVX-512; lscpu lists the "
          "flags) or kiln was built without oneDNN");
  }
  t.cuda_graphs = !a.has("no-cuda-graphs");
  t.cpu_overwrite_inputs = !a.has("no-overwrite");
  return t;
}

void apply_target_flags(const Args& a) {
  Engine& engine = Engine::current();
  engine.set_target(target_from_flags(a, engine.target()));
  if (a.has("poison-buffers")) set_poison_buffers(true);
  engine.set_pipeline(pipeline_from_flags(a, engine.pipeline()));
}

PipelineOptions pipeline_from_flags(const Args& a, PipelineOptions p) {
  if (a.has("passes")) p.disabled = parse_pipeline_options(a.str("passes", "")).disabled;
  if (a.has("recompute")) p.recompute = parse_recompute_mode(a.str("recompute", ""));
  if (a.has("memory-budget")) p.memory_budget = parse_byte_size("--memory-budget", a.str("memory-budget", ""));
  return p;
}

size_t parse_byte_size(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string suffix = text.substr(used);
  double scale = 0;
  if (suffix.empty())
    scale = 1;
  else if (suffix == "K" || suffix == "k")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "m")
    scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g")
    scale = 1024.0 * 1024 * 1024;
  if (used == 0 || scale == 0 || !(value * scale >= 1))
    throw Error(flag +
                ": expected a positive size in bytes, with an optional K, M or G suffix (KiB, MiB, GiB), "
                "received '" +
                text + "'");
  return static_cast<size_t>(value * scale);
}

void log_cpu_bf16(const Target& t, Precision precision) {
  bool emulated = false;
  const std::string summary = cpu_bf16_summary(t, &emulated);
  if (emulated && precision == Precision::bf16)
    spdlog::warn("CPU bf16: {}", summary);
  else
    spdlog::info("CPU bf16: {}", summary);
}

void apply_thread_flag(const Args& a) {
  if (a.has("threads")) {
    const int64_t n = a.integer("threads", 0);
    if (n < 1 || n > 4096)
      throw Error("--threads: expected a thread count from 1 to 4096, received " + std::to_string(n));
    set_num_threads(static_cast<int>(n));
  }
}

void join_ranks() {
  if (!launched_by_mpi_with_several_ranks()) return;
  set_world(connect_mpi(settings().collective_timeout));
  if (world().rank() != 0) spdlog::set_level(spdlog::level::warn);
}

void apply_collectives_flag(const Args& a, const DeviceSelection& device, bool shard_optimizer) {
  const std::string choice = a.str("collectives", "auto");
  if (choice != "noop") {
    cuda::CollectiveChoice c = cuda::parse_collective_choice(choice);
    if (shard_optimizer && device.device == Device::CUDA && world().size() > 1 &&
        c == cuda::CollectiveChoice::automatic) {
      c = cuda::CollectiveChoice::host;
      spdlog::info(
          "--shard-optimizer on GPUs: collectives through host memory (NCCL's reduce-scatter and all-gather have "
          "not run on a GPU in kiln's checks yet; --collectives nccl takes them)");
    }
    connect_device_collective_if_needed(device, c);
    return;
  }
  if (device.device == Device::CUDA)
    throw Error("--collectives noop: for CPU steps only (a GPU step's all-reduce is a node of its graph)");
  set_world(with_noop_collectives(shared_world()));
  spdlog::info("--collectives noop: every all-reduce of the step is a local no-op (the results are this rank's own)");
}

namespace {
models::ModelAttributes attributes_from_flags(const Args& a, const std::string& arch, int64_t vocab_size,
                                              double dropout) {
  models::ModelAttributes m;
  m.set("vocab_size", static_cast<double>(vocab_size > 0 ? vocab_size : a.integer("vocab-size", 65, 1)));
  m.set("block_size", static_cast<double>(a.integer("block", 64, 1)));
  m.set("n_layer", static_cast<double>(a.integer("layers", 4, 1)));
  m.set("n_head", static_cast<double>(a.integer("heads", 4, 1)));
  m.set("n_embd", static_cast<double>(a.integer("embd", 128, 1)));
  for (const char* llama_only : {"kv-heads", "ffn-hidden", "rope-theta", "tie-embeddings"})
    if (arch != "llama" && a.has(llama_only))
      throw Error(std::string("option --") + llama_only + " applies to --model llama only");
  if (arch == "gpt") {
    m.set("dropout", dropout);
  } else if (arch == "llama") {
    models::LlamaConfig c;
    c.n_embd = m.get_int("n_embd");
    m.set("n_kv_head", static_cast<double>(a.integer("kv-heads", 2, 1)));
    m.set("ffn_hidden", static_cast<double>(a.integer("ffn-hidden", c.hidden(), 1)));
    m.set("rope_theta", a.real("rope-theta", 10000.0, 1.0, 1e12, false));
    m.set("norm_eps", c.norm_eps);
    m.set("tie_embeddings", a.has("tie-embeddings") ? 1 : 0);
    if (dropout != 0) throw Error("--dropout applies to --model gpt only (Llama has no dropout)");
  }
  return m;
}
}  // namespace

std::unique_ptr<models::CausalLM> model_from_flags(const Args& a, int64_t vocab_size, double dropout) {
  const std::string arch = a.str("model", "gpt");
  return models::make_model(arch, attributes_from_flags(a, models::architecture(arch).name, vocab_size, dropout),
                            "the model options");
}

std::unique_ptr<models::CausalLM> load_initial_model(const std::string& path, const Args& a, double dropout,
                                                     std::optional<Tokenizer>& tokenizer) {
  std::unique_ptr<models::CausalLM> model;
  if (std::filesystem::is_directory(path)) {
    HfImport imported = import_hf_model(path);
    if (!imported.tokenizer_note.empty()) spdlog::warn("{}", imported.tokenizer_note);
    model = std::move(imported.model);
    tokenizer = std::move(imported.tokenizer);
  } else {
    model = load_model(path);
    tokenizer = load_tokenizer(path);
  }
  const models::ModelAttributes file = model->attributes();
  auto refuse = [&](const std::string& flag, const std::string& given, const std::string& held) {
    throw Error("--" + flag + " " + given + " disagrees with '" + path + "', whose " + model->architecture() +
                " model has " + held + " (--init-from takes the architecture and config of its weights)");
  };
  if (a.has("model") && models::architecture(a.str("model", "")).name != model->architecture())
    refuse("model", a.str("model", ""), "that architecture");
  const std::pair<const char*, const char*> sizes[] = {
      {"vocab-size", "vocab_size"}, {"block", "block_size"},   {"layers", "n_layer"},       {"heads", "n_head"},
      {"embd", "n_embd"},           {"kv-heads", "n_kv_head"}, {"ffn-hidden", "ffn_hidden"}};
  for (const auto& [flag, attribute] : sizes)
    if (a.has(flag) && (!file.has(attribute) || a.integer(flag, 0) != file.get_int(attribute)))
      refuse(flag, a.str(flag, ""),
             file.has(attribute) ? std::string(attribute) + " " + std::to_string(file.get_int(attribute))
                                 : std::string("no ") + attribute);
  if (a.has("rope-theta") && (!file.has("rope_theta") || a.real("rope-theta", 0) != file.get("rope_theta")))
    refuse("rope-theta", a.str("rope-theta", ""),
           file.has("rope_theta") ? fmt::format("rope_theta {}", file.get("rope_theta")) : "no rope_theta");
  if (a.has("tie-embeddings") && (!file.has("tie_embeddings") || file.get_int("tie_embeddings") != 1))
    refuse("tie-embeddings", "(given)",
           file.has("tie_embeddings") ? "an untied head" : "no such option (it is Llama's)");
  if (a.has("dropout") && (!file.has("dropout") || file.get("dropout") != dropout))
    refuse("dropout", fmt::format("{}", dropout),
           file.has("dropout") ? fmt::format("dropout {}", file.get("dropout")) : "no dropout");
  spdlog::info("init from {}: {}, {} parameters", path, model->architecture(), model->num_parameters());
  return model;
}

void check_model_flags(const Args& a) {
  const models::Architecture& arch = models::architecture(a.str("model", "gpt"));
  models::check_attributes(arch, attributes_from_flags(a, arch.name, 0, 0), "the model options");
}

int cmd_sample(const std::vector<std::string>& argv) {
  Args a(argv,
         {{"weights", "weights file (required)"},
          {"prompt", "text to continue (default: a newline)"},
          {"tokens", "tokens to generate (default 200)"},
          {"temperature", "sampling temperature >= 0 (default 0.8; 0: always the most likely token)"},
          {"top-k", "draw among the K most likely tokens only (default 0: all)"},
          {"top-p", "draw among the fewest most likely tokens whose probability reaches P, in (0, 1] (default 1: all)"},
          {"seed", "sampling seed (default 1)"},
          {"no-kv-cache", "run the model on the whole window for every token instead of one cached step"},
          {"non-strict", kNonStrictHelp}},
         "usage: kiln sample --weights model.h5 [options]\n\nGenerates text from a trained model (GPT or Llama), one "
         "decode step per token with a key/value cache\n(recorded once, replayed for each token), and reports tokens "
         "per second on standard error.",
         {"no-kv-cache", "non-strict"});
  if (a.help()) {
    a.print_help();
    return 0;
  }
  SampleOptions o;  // options first: a bad value is reported before any file is read
  o.tokens = a.integer("tokens", 200, 0);
  o.temperature = a.real("temperature", 0.8, 0.0, 1e6);
  o.top_k = a.integer("top-k", 0, 0);
  o.top_p = a.real("top-p", 1.0);
  if (!(o.top_p > 0 && o.top_p <= 1)) throw Error("--top-p must lie in (0, 1], received " + a.str("top-p", ""));
  o.seed = static_cast<uint64_t>(a.integer("seed", 1));
  o.kv_cache = !a.has("no-kv-cache");
  std::string path = a.required("weights");
  Tokenizer tok = require_tokenizer(path);
  auto model = load_model_for_inference(path, a);
  std::string prompt = a.str("prompt", "\n");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string text = sample_text(*model, tok, prompt, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s%s\n", prompt.c_str(), text.c_str());
  std::fprintf(stderr, "%lld tokens in %.2f s: %.1f tokens/s (%s)\n", static_cast<long long>(o.tokens), seconds,
               static_cast<double>(o.tokens) / seconds, o.kv_cache ? "key/value cache" : "no cache, whole window");
  return 0;
}

int cmd_eval(const std::vector<std::string>& argv) {
  Args a(argv,
         {{"weights", "weights file (required)"}, {"data", "text file (required)"}, {"non-strict", kNonStrictHelp}},
         "usage: kiln eval --weights model.h5 --data FILE [--non-strict]\n\nPrints the mean loss in nats per token "
         "over non-overlapping\n"
         "block-long windows of the file (a last partial window is dropped).",
         {"non-strict"});
  if (a.help()) {
    a.print_help();
    return 0;
  }
  std::string path = a.required("weights");
  Tokenizer tok = require_tokenizer(path);
  auto model = load_model_for_inference(path, a);
  std::vector<int32_t> ids = tok.encode(read_corpus(a.required("data")));
  const int64_t block = model->block_size();
  const int64_t windows = ids.size() > 0 ? static_cast<int64_t>((ids.size() - 1) / static_cast<size_t>(block)) : 0;
  if (windows == 0) throw Error("the data has fewer than block_size + 1 = " + std::to_string(block + 1) + " tokens");
  const int64_t per_batch = 16;
  double total = 0;
  for (int64_t w0 = 0; w0 < windows; w0 += per_batch) {
    int64_t n = std::min(per_batch, windows - w0);
    HostTensor x = HostTensor::zeros(DType::i32, Shape{n, block}), y = HostTensor::zeros(DType::i32, Shape{n, block});
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < block; ++j) {
        size_t at = static_cast<size_t>((w0 + r) * block + j);
        x.data<int32_t>()[r * block + j] = ids[at];
        y.data<int32_t>()[r * block + j] = ids[at + 1];
      }
    total += model->loss(Tensor::from_host(x), Tensor::from_host(y)).item() * static_cast<double>(n);
  }
  std::printf("%.6f nats/token over %lld windows of %lld tokens\n", total / static_cast<double>(windows),
              static_cast<long long>(windows), static_cast<long long>(block));
  return 0;
}

int cmd_tokenize(const std::vector<std::string>& argv) {
  Args a(argv,
         {{"weights", "weights file whose tokenizer to use (required)"},
          {"data", "text file or directory to encode"},
          {"out", "token file to write: flat little-endian ids, as nanoGPT's train.bin (with --data)"},
          {"dtype", "uint16 (default; ids below 65536) or uint32"},
          {"json", "write a bpe tokenizer as Hugging Face tokenizers' tokenizer.json here"}},
         "usage: kiln tokenize --weights model.h5 [--data FILE --out tokens.bin] [--json tokenizer.json]\n\n"
         "Encodes text with the tokenizer stored in a weights file into a token file (kiln train --tokens reads it),\n"
         "and exports a bpe tokenizer for Hugging Face tools.");
  if (a.help()) {
    a.print_help();
    return 0;
  }
  const std::string dtype = a.str("dtype", "uint16");
  if (dtype != "uint16" && dtype != "uint32") throw Error("--dtype must be uint16 or uint32, received '" + dtype + "'");
  if (a.has("data") != a.has("out")) throw Error("--data and --out go together");
  if (!a.has("data") && !a.has("json")) throw Error("nothing to do: give --data and --out, or --json");
  const std::string path = a.required("weights");
  const Tokenizer tok = require_tokenizer(path);
  if (a.has("json")) {
    const std::optional<std::string> json = tok.hf_tokenizer_json();
    if (!json) throw Error("--json: the weights file's tokenizer is " + std::string(tok.kind_name()) + ", not bpe");
    write_file_atomically(a.str("json", ""), *json);
    std::printf("wrote %s (%lld tokens)\n", a.str("json", "").c_str(), static_cast<long long>(tok.vocab_size()));
  }
  if (!a.has("data")) return 0;
  if (dtype == "uint16" && tok.vocab_size() > 65536)
    throw Error("--dtype uint16 holds ids below 65536; this tokenizer has " + std::to_string(tok.vocab_size()) +
                ": use --dtype uint32");
  const std::vector<int32_t> ids = tok.encode(read_corpus(a.str("data", "")));
  std::string bytes;
  const size_t width = dtype == "uint16" ? 2 : 4;
  bytes.reserve(ids.size() * width);
  for (int32_t id : ids)
    for (size_t k = 0; k < width; ++k) bytes += static_cast<char>((static_cast<uint32_t>(id) >> (8 * k)) & 0xFF);
  write_file_atomically(a.str("out", ""), bytes);
  std::printf("wrote %s: %zu tokens (%s)\n", a.str("out", "").c_str(), ids.size(), dtype.c_str());
  return 0;
}

int cmd_init(const std::vector<std::string>& argv) {
  Args a(argv,
         with_model_flags({{"out", "weights file to write (required)"}, {"seed", "initialization seed (default 1337)"}},
                          true),
         "usage: kiln init --out model.h5 [options]\n\nWrites freshly initialized weights of a GPT (GPT-2 "
         "initialization) or "
         "a Llama.",
         with_model_switches());
  if (a.help()) {
    a.print_help();
    return 0;
  }
  manual_seed(static_cast<uint64_t>(a.integer("seed", 1337)));
  std::unique_ptr<models::CausalLM> model = model_from_flags(a);
  save_weights(a.required("out"), *model);
  std::printf("wrote %s (%s, %zu parameters)\n", a.required("out").c_str(), model->architecture().c_str(),
              model->num_parameters());
  return 0;
}

}  // namespace kiln::cli
