// `kiln gradcheck`: the f64 finite-difference check of every parameter of a small model's loss,
// as a table (name, shape, elements, norm-relative error, worst element).
#include <cstdio>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/gradcheck.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

int cmd_gradcheck(const std::vector<std::string>& argv) {
  Args a(
      argv,
      with_model_flags({{"batch", "sequences (default 2)"},
                        {"seed", "seed for the weights and the batch (default 1)"},
                        {"elements", "check this many elements per tensor, a seeded subset (default: all)"},
                        {"step", "relative central-difference step (default 1e-4, with Richardson extrapolation)"},
                        {"tolerance", "norm-relative tolerance per tensor (default 1e-6)"}},
                       true),
      "usage: kiln gradcheck [--model gpt|llama] [options]\n\nChecks the gradient of a small model's loss with respect "
      "to every parameter against central\ndifferences in f64 and prints one line per parameter. Defaults: 2 layers, "
      "16 wide, 2 heads\n(1 key/value head), block 8, vocabulary 11.",
      with_model_switches());
  if (a.help()) {
    a.print_help();
    return 0;
  }
  // Small defaults: every element of every parameter is checked in seconds.
  std::vector<std::string> args = argv;
  auto default_to = [&](const char* flag, const char* value) {
    if (!a.has(flag)) args.insert(args.end(), {std::string("--") + flag, value});
  };
  default_to("layers", "2");
  default_to("embd", "16");
  default_to("heads", "2");
  default_to("block", "8");
  default_to("vocab-size", "11");
  if (a.str("model", "gpt") == "llama") {
    default_to("kv-heads", "1");
    default_to("ffn-hidden", "24");
  }
  const Args sized(
      args, with_model_flags({{"batch", ""}, {"seed", ""}, {"elements", ""}, {"step", ""}, {"tolerance", ""}}, true),
      "", with_model_switches());
  ad::GradCheckOptions opts;
  opts.elements_per_tensor = a.integer("elements", 0, 0);
  opts.step = a.real("step", opts.step, 0.0, 1.0, false);
  opts.tolerance = a.real("tolerance", opts.tolerance, 0.0, 1.0, false);
  const int64_t batch = a.integer("batch", 2, 1);
  manual_seed(static_cast<uint64_t>(a.integer("seed", 1)));
  std::unique_ptr<models::CausalLM> model = model_from_flags(sized);
  model->to(DType::f64);
  const int64_t t = model->block_size(), v = model->vocab_size();
  std::vector<int32_t> x, y;
  for (int64_t i = 0; i < batch * t; ++i) {
    x.push_back(static_cast<int32_t>((i * 7 + 3) % v));
    y.push_back(static_cast<int32_t>((i * 5 + 1) % v));
  }
  const HostTensor xs = Tensor::from_ints(x, {batch, t}).to_host(), ys = Tensor::from_ints(y, {batch, t}).to_host();
  const ad::GradCheckResult r = gradcheck([&](const std::vector<Tensor>& in) { return model->loss(in[0], in[1]); },
                                          {xs, ys}, model->named_parameters(), opts);
  std::printf("%s: %zu parameters, %zu values\n%s%s\n", model->architecture().c_str(), r.entries.size(),
              model->num_parameters(), r.report.c_str(), r.ok ? "all passed" : "FAILED");
  return r.ok ? 0 : 1;
}

}  // namespace kiln::cli
