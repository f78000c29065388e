// The kiln CLI's subcommands: each takes its arguments (after the subcommand's name) and
// returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace kiln::cli {

int cmd_prims(const std::vector<std::string>& args);
int cmd_train(const std::vector<std::string>& args);
int cmd_sample(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_init(const std::vector<std::string>& args);
int cmd_dump(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);

}  // namespace kiln::cli
