// The kiln CLI's subcommands: each takes its arguments (after the subcommand's name) and
// returns the process exit code.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "models/gpt.hpp"

namespace kiln::cli {

class Args;
// The model-shape options (--layers --heads --embd --block, and --vocab-size when asked) added
// to a command's own, and the config they give (defaults: kiln train's config, vocabulary 65).
std::map<std::string, std::string> with_model_flags(std::map<std::string, std::string> options, bool vocab_size);
models::GPTConfig config_from_flags(const Args& a);
// --threads N (CPU threads, fixed; without it kiln chooses, up to OMP_NUM_THREADS or the cores,
// and uses fewer while other work holds cores) added to a command's options, and applied.
std::map<std::string, std::string> with_thread_flag(std::map<std::string, std::string> options);
void apply_thread_flag(const Args& a);

int cmd_prims(const std::vector<std::string>& args);
int cmd_train(const std::vector<std::string>& args);
int cmd_sample(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_init(const std::vector<std::string>& args);
int cmd_dump(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_ptx(const std::vector<std::string>& args);

}  // namespace kiln::cli
