// `kiln ptx --out DIR`: writes every kernel one training step (GPT or Llama) (forward, backward, AdamW)
// lowers to, one .ptx file each, plus index.tsv: kernel, Prim(s), grid, block, and registers
// and spills from ptxas when it is on PATH. The step runs once on the CPU to build its plan;
// the plan's optimized circuit is then lowered (no GPU needed). With --bank-conflicts the step
// also runs once on the fake GPU (every kernel in the SIMT simulator), which counts each
// kernel's shared-memory requests and bank conflicts. With --estimate DEVICE it runs there with
// blocks sampled, and each kernel's time on that GPU is estimated from the counts
// (cuda/perf/estimate.hpp): index.tsv gains the launches a step makes, the estimate and its
// binding limit, and the command prints the step's estimate by kernel class.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <vector>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/perf/estimate.hpp>
#include <kiln/cuda/perf/kernel_work.hpp>
#include <kiln/cuda/runtime/runtime.hpp>
#include <kiln/train/adamw.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

namespace {

struct KernelRow {
  const cuda::Launch* launch;
  std::string prims;
  int64_t launches = 0;           // in the plan
  double compulsory_bytes = 0;    // summed over them: each op's inputs and outputs over its launches
};

// "kiln_fused_matmul_07c5711125017942" -> "kiln_fused_matmul": the kernel's family.
std::string kernel_class(const std::string& name) {
  const size_t at = name.rfind('_');
  return at == std::string::npos ? name : name.substr(0, at);
}

}  // namespace

int cmd_ptx(const std::vector<std::string>& argv) {
  Args a(argv,
         with_target_flags(with_precision_flag(
             with_model_flags({{"out", "directory to write the kernels to (required)"},
                               {"batch", "sequences per step (default 16)"},
                               {"sm", "target architecture: 80 or 90 (default 90)"},
                               {"bank-conflicts",
                                "also run the step in the SIMT simulator and report each kernel's shared-memory bank "
                                "conflicts per launch (slow: use a small config)"},
                               {"estimate",
                                "h100 or h200: run the step in the SIMT simulator with blocks sampled and estimate "
                                "each kernel's time on that GPU (cuda/perf/estimate.hpp)"},
                               {"sample-blocks",
                                "with --estimate: blocks simulated per launch, spread over its grid (default 8)"}},
                              true))),
         "usage: kiln ptx --out DIR [options]\n\nWrites the PTX of every kernel of one training step (AdamW) "
         "and an index.",
         with_target_switches(with_model_switches({"bank-conflicts"})));
  if (a.help()) {
    a.print_help();
    return 0;
  }
  apply_precision_flag(a);
  const std::filesystem::path out = a.required("out");
  const int sm = static_cast<int>(a.integer("sm", 90));
  if (sm != 80 && sm != 90) throw Error(fmt::format("kiln ptx: --sm takes 80 or 90, received {}", sm));
  // The kernels that device would run, the device's defaults settled (wgmma on sm_90) so that
  // the fake driver runs the same ones for --bank-conflicts.
  Target target = target_from_flags(a, cuda_target(sm, /*fake=*/false));
  target.matmul.wgmma = target.wgmma();
  Engine::current().set_target(target);  // the passes a GPU run would get; the step runs on the CPU
  Engine::current().set_pipeline(pipeline_from_flags(a, Engine::current().pipeline()));
  if (a.has("poison-buffers")) set_poison_buffers(true);
  const int64_t batch = a.integer("batch", 16, 1);
  std::unique_ptr<models::CausalLM> model_ptr = model_from_flags(a);
  models::CausalLM& model = *model_ptr;
  optim::AdamW opt(model.parameters(), {});
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{batch, model.block_size()});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>(i % model.vocab_size()));
  Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
  Tensor loss = model.loss(x, y);
  loss.backward();
  opt.step();
  const Plan* step = Engine::current().plan_cache().largest();
  if (!step) throw Error("kiln ptx: the training step built no plan");
  const Circuit& circuit = step->program->circuit();
  // The same step once more on the fake GPU, counting each kernel's work by name: every block
  // for the bank conflicts, or blocks sampled for the estimate (whose values are then meaningless).
  std::optional<perf::DeviceLimits> limits;
  if (a.has("estimate")) {
    limits = perf::device_limits(a.str("estimate", ""));
    if (!limits) throw Error("kiln ptx: --estimate takes h100 or h200, received '" + a.str("estimate", "") + "'");
  }
  const int64_t sample_blocks = a.integer("sample-blocks", 8, 1);
  std::map<std::string, cuda::FakeKernelStats> counted;
  if (a.has("bank-conflicts") || limits) {
    cuda::Runtime fake(cuda::fake_driver(), cuda::RuntimeOptions{"off", "", true});
    Engine::current().set_device(Device::CUDA, &fake);
    const cuda::ScopedSampledBlocks sampled(limits ? static_cast<uint64_t>(sample_blocks) : 0);
    if (!limits) cuda::fake_driver_count_bank_conflicts(true);
    Tensor device_loss = model.loss(x, y);
    device_loss.backward();
    opt.step();
    device_loss.item();
    counted = cuda::fake_driver_kernel_stats();
    cuda::fake_driver_count_bank_conflicts(false);
    Engine::current().set_device(Device::CPU);
  }

  std::vector<cuda::LoweredOp> lowered;
  for (size_t i = 0; i < circuit.ops().size(); ++i)
    lowered.push_back(cuda::lower(circuit, static_cast<int>(i), step->target));
  std::map<std::string, KernelRow> kernels;  // by name: one file per distinct kernel
  size_t launches = 0;
  for (size_t i = 0; i < lowered.size(); ++i)
    for (const auto& l : lowered[i].launches) {
      ++launches;
      auto [it, added] = kernels.try_emplace(l.kernel->name, KernelRow{&l, circuit.ops()[i].prim->name});
      if (!added && it->second.prims.find(circuit.ops()[i].prim->name) == std::string::npos)
        it->second.prims += "," + circuit.ops()[i].prim->name;
      ++it->second.launches;
      it->second.compulsory_bytes +=
          perf::compulsory_bytes(circuit, circuit.ops()[i]) / static_cast<double>(lowered[i].launches.size());
    }
  std::filesystem::create_directories(out);
  const bool have_ptxas = !cuda::find_ptxas().empty();
  if (!have_ptxas) spdlog::warn("ptxas not found on PATH: the index has no register counts");
  std::ofstream index(out / "index.tsv");
  index << "kernel\tprims\tgrid\tblock\tshared_bytes\tregisters\tspill_stores\tspill_loads\tshared_requests\tbank_"
           "conflicts\tlaunches\testimate_us\tbound\n";
  std::map<std::string, std::pair<int64_t, double>> by_class;  // launches, estimated seconds
  double step_s = 0;
  for (const auto& [name, row] : kernels) {
    const std::string ptx = kir::print_ptx(*row.launch->kernel, sm);
    std::ofstream(out / (name + ".ptx")) << ptx;
    const auto& g = row.launch->grid;
    index << name << '\t' << row.prims << '\t' << g.x << 'x' << g.y << 'x' << g.z << '\t'
          << row.launch->block.x * row.launch->block.y * row.launch->block.z << '\t'
          << row.launch->kernel->shared_bytes();
    int registers = 0;
    if (have_ptxas) {
      cuda::PtxasResult r = cuda::run_ptxas(ptx, sm);
      if (!r.ok) throw Error("kiln ptx: ptxas rejected " + name + ":\n" + r.log);
      index << '\t' << r.registers << '\t' << r.spill_stores << '\t' << r.spill_loads;
      registers = r.registers;
    } else {
      index << "\t-\t-\t-";
    }
    // Per launch; "-" where not measured (neither --bank-conflicts nor --estimate, or the fake
    // GPU's plan did not launch this kernel).
    const auto it = counted.find(name);
    const bool ran = it != counted.end() && it->second.launches > 0;
    if (ran)
      index << '\t' << it->second.shared_requests / it->second.launches << '\t'
            << it->second.bank_conflicts / it->second.launches;
    else
      index << "\t-\t-";
    index << '\t' << row.launches;
    if (ran && limits) {
      const perf::KernelEstimate e = perf::estimate(
          perf::work_per_launch(it->second, *row.launch, registers,
                                row.compulsory_bytes / static_cast<double>(row.launches)),
          *limits);
      index << '\t' << fmt::format("{:.2f}", e.seconds * 1e6) << '\t' << perf::limit_name(e.binding);
      auto& [class_launches, class_s] = by_class[kernel_class(name)];
      class_launches += row.launches;
      class_s += e.seconds * static_cast<double>(row.launches);
      step_s += e.seconds * static_cast<double>(row.launches);
    } else {
      index << "\t-\t-";
    }
    index << '\n';
  }
  if (!index) throw Error("kiln ptx: cannot write " + (out / "index.tsv").string());
  std::printf("%zu ops, %zu launches, %zu distinct kernels for sm_%d written to %s (index.tsv)\n", circuit.ops().size(),
              launches, kernels.size(), sm, out.c_str());
  if (limits) {
    std::printf("estimated step on %s: %.3f ms of kernels (%lld blocks sampled a launch%s)\n", limits->name.c_str(),
                step_s * 1e3, static_cast<long long>(sample_blocks),
                have_ptxas ? "" : "; no ptxas: 32 registers a thread assumed");
    std::vector<std::pair<std::string, std::pair<int64_t, double>>> classes(by_class.begin(), by_class.end());
    std::sort(classes.begin(), classes.end(), [](const auto& x, const auto& y) { return x.second.second > y.second.second; });
    for (const auto& [family, totals] : classes)
      std::printf("  %-28s %4lld launches %10.3f ms %5.1f%%\n", family.c_str(), static_cast<long long>(totals.first),
                  totals.second * 1e3, 100.0 * totals.second / std::max(step_s, 1e-30));
  }
  return 0;
}

}  // namespace kiln::cli
