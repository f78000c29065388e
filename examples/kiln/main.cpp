// kiln: one binary, subcommands. `kiln --help` lists them; `kiln <command> --help` explains one.
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/version.hpp>

#include "commands.hpp"

namespace {

struct Command {
  std::function<int(const std::vector<std::string>&)> run;
  const char* summary;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"prims", {kiln::cli::cmd_prims, "print the Prim catalogue and what each Prim implements"}},
      {"train", {kiln::cli::cmd_train, "train a GPT or a Llama on text or token data; save weights; print a sample"}},
      {"sample", {kiln::cli::cmd_sample, "generate text from a weights file"}},
      {"eval", {kiln::cli::cmd_eval, "mean loss (nats/token) of a weights file on a text file"}},
      {"init", {kiln::cli::cmd_init, "write freshly initialized GPT or Llama weights"}},
      {"tokenize",
       {kiln::cli::cmd_tokenize,
        "encode text into a token file with a weights file's tokenizer; export it as tokenizer.json"}},
      {"import",
       {kiln::cli::cmd_import, "read a Hugging Face model directory (GPT-2, Llama; safetensors) into a weights file"}},
      {"export", {kiln::cli::cmd_export, "write a weights file as a Hugging Face model directory (safetensors)"}},
      {"dump", {kiln::cli::cmd_dump, "logits, loss and gradients of one batch, for checks against other frameworks"}},
      {"gradcheck",
       {kiln::cli::cmd_gradcheck,
        "check every parameter's gradient of a small GPT or Llama against finite differences"}},
      {"ptx", {kiln::cli::cmd_ptx, "write the PTX of every kernel of one training step, with an index"}},
      {"plot", {kiln::cli::cmd_plot, "draw training and validation loss curves of metrics logs as an SVG picture"}},
      {"bench", {kiln::cli::cmd_bench, "time full training steps; compare with the machine's GEMM rate"}},
      {"tune", {kiln::cli::cmd_tune, "measure each kernel's candidates on this device; keep the fastest checked ones"}},
  };
  return table;
}

void usage() {
  std::printf("usage: kiln <command> [options]\n       kiln --version\n\ncommands:\n");
  for (const auto& [name, c] : commands()) std::printf("  %-8s %s\n", name.c_str(), c.summary);
  std::printf("\n`kiln <command> --help` describes a command's options.\n\nenvironment:\n");
  for (const kiln::Variable& v : kiln::variables()) std::printf("  %-22s %s\n", v.name, v.meaning);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::printf("kiln %s\n", kiln::version_string);
    return 0;
  }
  auto it = commands().find(argv[1]);
  if (it == commands().end()) {
    std::fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage();
    return 2;
  }
  // A misspelt variable would otherwise change nothing without a word.
  for (const std::string& name : kiln::unknown_variables())
    std::fprintf(stderr, "kiln: warning: %s is set but kiln reads no such variable (`kiln --help` lists them)\n",
                 name.c_str());
  try {
    kiln::settings();  // a malformed KILN_* setting is reported before any work
    return it->second.run(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln %s: error: %s\n", argv[1], e.what());
    // One rank of several failing ends the whole job (the others may wait in a collective).
    if (kiln::world().size() > 1) kiln::world().abort(1);
    return 1;
  }
}
