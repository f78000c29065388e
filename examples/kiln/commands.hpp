// The kiln CLI's subcommands: each takes its arguments (after the subcommand's name) and
// returns the process exit code.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <kiln/circuit/ir/target.hpp>
#include <kiln/core/precision.hpp>
#include <kiln/core/tuning.hpp>
#include <kiln/models/causal_lm.hpp>
#include <kiln/train/tokenizer.hpp>

namespace kiln::cuda {
class Runtime;
}

namespace kiln::cli {

class Args;
// The model options (--model gpt|llama, --layers --heads --embd --block, Llama's --kv-heads
// --ffn-hidden --rope-theta --tie-embeddings, and --vocab-size when asked) added to a command's
// own, and the model they describe (defaults: kiln train's sizes, vocabulary 65), initialized from
// the engine's seed. vocab_size, when given, replaces --vocab-size (a tokenizer's size).
std::map<std::string, std::string> with_model_flags(std::map<std::string, std::string> options, bool vocab_size);
// The model options that take no value (--tie-embeddings), added to a command's own switches.
std::set<std::string> with_model_switches(std::set<std::string> switches = {});
std::unique_ptr<models::CausalLM> model_from_flags(const Args& a, int64_t vocab_size = 0, double dropout = 0);
// --non-strict (sample, eval, dump): the model a weights file describes, loaded strictly unless
// the flag is given (then the parameters the file holds are loaded and what did not match is
// reported on standard error).
constexpr const char* kNonStrictHelp =
    "load a file whose datasets do not match the model one for one (PyTorch's strict=False): the parameters it "
    "holds are loaded, the missing and unexpected ones reported";
std::unique_ptr<models::CausalLM> load_model_as_flagged(const std::string& path, const Args& a);
// --init-from: the model a kiln weights file or a Hugging Face model directory holds, its weights
// loaded, and its tokenizer (none where it has none kiln reads); every model flag given (and
// --dropout, `dropout`) must agree with its config, or it is an error naming the flag and both values.
std::unique_ptr<models::CausalLM> load_initial_model(const std::string& path, const Args& a, double dropout,
                                                     std::optional<Tokenizer>& tokenizer);
// Checks the model flags (architecture and sizes) without building anything.
void check_model_flags(const Args& a);
// --threads N (CPU threads, fixed; without it kiln chooses, up to OMP_NUM_THREADS or the cores,
// and uses fewer while other work holds cores) added to a command's options, and applied.
std::map<std::string, std::string> with_thread_flag(std::map<std::string, std::string> options);
void apply_thread_flag(const Args& a);
// Under mpirun (or srun) with several ranks: joins the job through MPI; ranks other than 0 log
// warnings and errors only. Then `--collectives`: auto, nccl or host choose a GPU step's device
// collective; noop (CPU steps) makes every all-reduce of the step a local no-op of the same size,
// the baseline of the exposed communication time (docs/CLI.md).
void join_ranks();
// With `shard_optimizer` on GPUs, auto means host staging: NCCL's reduce-scatter and all-gather
// have not run on a GPU yet (--collectives nccl takes them).
void apply_collectives_flag(const Args& a, const DeviceSelection& device, bool shard_optimizer = false);
// --precision f32|bf16 (core/precision.hpp) added to a command's options, and applied to the
// engine.
std::map<std::string, std::string> with_precision_flag(std::map<std::string, std::string> options);
void apply_precision_flag(const Args& a);
// The lowering Target's choices and the pipeline's options (--matmul KEY=VALUE,..., --tf32,
// --attention-path mma|simt, --passes -NAME,..., --no-cuda-graphs; --poison-buffers, the executor's debugging aid)
// added to a command's options and switches, and parsed into `target` and the engine's pipeline options (a bad value is
// an error naming the option). docs/CLI.md describes them.
std::map<std::string, std::string> with_target_flags(std::map<std::string, std::string> options);
std::set<std::string> with_target_switches(std::set<std::string> switches);
Target target_from_flags(const Args& a, Target target);
void apply_target_flags(const Args& a);  // to Engine::current(): its Target and pipeline options
// --passes, --recompute and --memory-budget over `p`.
PipelineOptions pipeline_from_flags(const Args& a, PipelineOptions p);
// "512M" -> 536870912 (K, M, G: KiB, MiB, GiB); an error names `flag` for anything else.
size_t parse_byte_size(const std::string& flag, const std::string& text);
// "CPU bf16: AMX" (or AVX512-BF16, or "none: bf16 is emulated and slower than f32", a warning
// under --precision bf16): what a CPU run does with bf16 products.
void log_cpu_bf16(const Target& t, Precision precision);

// --tune off|cached|on (core/tuning.hpp) added to a command's options, and applied to the engine's
// Target (after apply_target_flags; `runtime`: the CUDA device's, whose identity keys its file, or
// null on the CPU); `list_choices` logs every tuned choice (--stats). An explicit --threads or
// --matmul wins over the tuned thread counts or matmul keys. Returns the mode; under `on` the
// caller asks the engine to tune its first step (Engine::set_tune_next_plan) right before it.
std::map<std::string, std::string> with_tune_flag(std::map<std::string, std::string> options);
TuneMode apply_tune_flag(const Args& a, cuda::Runtime* runtime, bool list_choices = false);

int cmd_prims(const std::vector<std::string>& args);
int cmd_tune(const std::vector<std::string>& args);
int cmd_train(const std::vector<std::string>& args);
int cmd_sample(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_init(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_gradcheck(const std::vector<std::string>& args);
int cmd_dump(const std::vector<std::string>& args);
int cmd_import(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_ptx(const std::vector<std::string>& args);
int cmd_plot(const std::vector<std::string>& args);

}  // namespace kiln::cli
