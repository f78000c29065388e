// `kiln ptx --out DIR`: writes every kernel one training step (GPT or Llama) (forward, backward, AdamW)
// lowers to, one .ptx file each, plus index.tsv: kernel, Prim(s), grid, block, and registers
// and spills from ptxas when it is on PATH. The step runs once on the CPU to build its plan;
// the plan's optimized circuit is then lowered (no GPU needed). With --bank-conflicts the step
// also runs once on the fake GPU (every kernel in the SIMT simulator), which counts each
// kernel's shared-memory requests and bank conflicts.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/passes/pipeline.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/cuda/driver/fake_driver.hpp>
#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/runtime/runtime.hpp>
#include <kiln/train/adamw.hpp>

#include "args.hpp"
#include "commands.hpp"

namespace kiln::cli {

namespace {

struct KernelRow {
  const cuda::Launch* launch;
  std::string prims;
};

}  // namespace

int cmd_ptx(const std::vector<std::string>& argv) {
  Args a(argv,
         with_target_flags(with_precision_flag(
             with_model_flags({{"out", "directory to write the kernels to (required)"},
                               {"batch", "sequences per step (default 16)"},
                               {"sm", "target architecture: 80 or 90 (default 90)"},
                               {"bank-conflicts",
                                "also run the step in the SIMT simulator and report each kernel's shared-memory bank "
                                "conflicts per launch (slow: use a small config)"}},
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
  // The same step once more on the fake GPU, counting bank conflicts per kernel name.
  std::map<std::string, cuda::FakeKernelStats> banks;
  const bool count_banks = a.has("bank-conflicts");
  if (count_banks) {
    cuda::Runtime fake(cuda::fake_driver(), cuda::RuntimeOptions{"off", "", true});
    Engine::current().set_device(Device::CUDA, &fake);
    cuda::fake_driver_count_bank_conflicts(true);
    Tensor device_loss = model.loss(x, y);
    device_loss.backward();
    opt.step();
    device_loss.item();
    banks = cuda::fake_driver_kernel_stats();
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
    }
  std::filesystem::create_directories(out);
  const bool have_ptxas = !cuda::find_ptxas().empty();
  if (!have_ptxas) spdlog::warn("ptxas not found on PATH: the index has no register counts");
  std::ofstream index(out / "index.tsv");
  index << "kernel\tprims\tgrid\tblock\tshared_bytes\tregisters\tspill_stores\tspill_loads\tshared_requests\tbank_"
           "conflicts\n";
  for (const auto& [name, row] : kernels) {
    const std::string ptx = kir::print_ptx(*row.launch->kernel, sm);
    std::ofstream(out / (name + ".ptx")) << ptx;
    const auto& g = row.launch->grid;
    index << name << '\t' << row.prims << '\t' << g.x << 'x' << g.y << 'x' << g.z << '\t'
          << row.launch->block.x * row.launch->block.y * row.launch->block.z << '\t'
          << row.launch->kernel->shared_bytes();
    if (have_ptxas) {
      cuda::PtxasResult r = cuda::run_ptxas(ptx, sm);
      if (!r.ok) throw Error("kiln ptx: ptxas rejected " + name + ":\n" + r.log);
      index << '\t' << r.registers << '\t' << r.spill_stores << '\t' << r.spill_loads;
    } else {
      index << "\t-\t-\t-";
    }
    // Per launch; "-" where not measured (no --bank-conflicts, or the fake GPU's plan did not
    // launch this kernel).
    if (auto it = banks.find(name); it != banks.end() && it->second.launches > 0)
      index << '\t' << it->second.shared_requests / it->second.launches << '\t'
            << it->second.bank_conflicts / it->second.launches;
    else
      index << "\t-\t-";
    index << '\n';
  }
  if (!index) throw Error("kiln ptx: cannot write " + (out / "index.tsv").string());
  std::printf("%zu ops, %zu launches, %zu distinct kernels for sm_%d written to %s (index.tsv)\n", circuit.ops().size(),
              launches, kernels.size(), sm, out.c_str());
  return 0;
}

}  // namespace kiln::cli
