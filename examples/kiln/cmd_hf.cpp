// `kiln import DIR --out model.h5` and `kiln export model.h5 --hf DIR`: Hugging Face model
// directories (config.json + safetensors) to kiln weights files and back (train/hf_model.hpp).
#include <cstdio>
#include <filesystem>
#include <set>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/process_counters.hpp>
#include <kiln/train/hf_model.hpp>
#include <kiln/train/progress_line.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

namespace {
// The command's one positional argument (before or after the options), and the rest for Args.
std::pair<std::string, std::vector<std::string>> positional(const std::vector<std::string>& argv, const char* what,
                                                            const std::set<std::string>& switches = {}) {
  std::vector<std::string> rest;
  std::string found;
  for (size_t i = 0; i < argv.size(); ++i) {
    const bool option = argv[i].rfind("--", 0) == 0;
    if (option) {
      rest.push_back(argv[i]);
      // An option's value follows it unless the option is a switch or --help.
      if (argv[i] != "--help" && !switches.count(argv[i].substr(2)) && i + 1 < argv.size()) rest.push_back(argv[++i]);
    } else if (found.empty()) {
      found = argv[i];
    } else {
      throw Error(std::string("expected one ") + what + ", received '" + found + "' and '" + argv[i] + "'");
    }
  }
  return {found, rest};
}
}  // namespace

int cmd_import(const std::vector<std::string>& argv) {
  auto [dir, rest] = positional(argv, "model directory");
  Args a(rest, {{"out", "kiln weights file to write (required)"}},
         "usage: kiln import DIR --out model.h5\n\n"
         "Reads a local Hugging Face model directory (config.json and model.safetensors, or the shards\n"
         "that model.safetensors.index.json lists) of a GPT2LMHeadModel or LlamaForCausalLM, with f32, bf16,\n"
         "f16 or f64 tensors, and its tokenizer.json where it is a byte-level BPE, and writes them as a kiln\n"
         "weights file (f32). Settings kiln does not implement are refused by name.");
  if (a.help()) {
    a.print_help();
    return 0;
  }
  if (dir.empty()) throw Error("expected a model directory: kiln import DIR --out model.h5");
  const std::string out = a.required("out");
  ProgressLine line(ProgressLine::stdout_is_terminal());
  HfImport imported = convert_hf_model(dir, out, [&](size_t done, size_t total) {
    line.update("converting tensors: " + std::to_string(done) + "/" + std::to_string(total), done == total);
  });
  line.clear();
  uint64_t stored_bytes = 0;
  for (const std::string& f : imported.files) stored_bytes += std::filesystem::file_size(f);
  std::printf("imported %s: %s, %zu parameters from %zu file(s)", dir.c_str(), imported.model->architecture().c_str(),
              imported.model->num_parameters(), imported.files.size());
  if (!imported.skipped.empty()) std::printf("; %zu stored buffers or tied copies skipped", imported.skipped.size());
  // The f32 weights' bytes: what the import writes, and what its memory is measured against.
  const double weights_bytes = 4.0 * static_cast<double>(imported.model->num_parameters());
  std::printf("\nwrote %s; peak resident memory %.0f MB, %.2fx the f32 weights' %.0f MB (the checkpoint: %.0f MB)\n",
              out.c_str(), static_cast<double>(peak_resident_bytes()) / 1e6,
              static_cast<double>(peak_resident_bytes()) / weights_bytes, weights_bytes / 1e6,
              static_cast<double>(stored_bytes) / 1e6);
  if (imported.tokenizer)
    std::printf("tokenizer: %s/tokenizer.json, byte-level BPE of %lld ids\n", dir.c_str(),
                static_cast<long long>(imported.tokenizer->vocab_size()));
  if (!imported.tokenizer_note.empty()) std::printf("note: %s\n", imported.tokenizer_note.c_str());
  return 0;
}

int cmd_export(const std::vector<std::string>& argv) {
  auto [weights, rest] = positional(argv, "weights file", {"non-strict"});
  Args a(rest,
         {{"hf", "Hugging Face model directory to write (required)"},
          {"dtype", "f32 (default) or bf16: the stored tensors' type"},
          {"non-strict", kNonStrictHelp}},
         "usage: kiln export model.h5 --hf DIR [--dtype f32|bf16]\n\n"
         "Writes DIR/config.json and DIR/model.safetensors, which transformers'\n"
         "AutoModelForCausalLM.from_pretrained(DIR) loads (GPT2LMHeadModel or LlamaForCausalLM).",
         {"non-strict"});
  if (a.help()) {
    a.print_help();
    return 0;
  }
  if (weights.empty()) throw Error("expected a weights file: kiln export model.h5 --hf DIR");
  const std::string dt = a.str("dtype", "f32");
  if (dt != "f32" && dt != "bf16") throw Error("--dtype must be f32 or bf16, received '" + dt + "'");
  const std::string dir = a.required("hf");
  std::unique_ptr<models::CausalLM> model = load_model_as_flagged(weights, a);
  const std::optional<Tokenizer> tokenizer = load_tokenizer(weights);
  export_hf_model(*model, dir, dt == "f32" ? DType::f32 : DType::bf16, tokenizer ? &*tokenizer : nullptr);
  const bool json = tokenizer && tokenizer->hf_tokenizer_json();
  std::printf("wrote %s/config.json%s and %s/model.safetensors (%s, %zu parameters, %s)\n", dir.c_str(),
              json ? ", tokenizer.json" : "", dir.c_str(), model->architecture().c_str(), model->num_parameters(),
              dt.c_str());
  return 0;
}

}  // namespace kiln::cli
