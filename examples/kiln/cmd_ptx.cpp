// `kiln ptx --out DIR`: writes every kernel one GPT training step (forward, backward, AdamW)
// lowers to, one .ptx file each, plus index.tsv: kernel, Prim(s), grid, block, and registers
// and spills from ptxas when it is on PATH. The step runs once on the CPU to build its plan;
// the plan's optimized circuit is then lowered (no GPU needed).
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "args.hpp"
#include "circuit/error.hpp"
#include "commands.hpp"
#include "core/engine.hpp"
#include "cuda/lower.hpp"
#include "cuda/ptx_printer.hpp"
#include "cuda/ptxas.hpp"
#include "train/adamw.hpp"

namespace kiln::cli {

namespace {

struct KernelRow {
  const cuda::Launch* launch;
  std::string prims;
};

}  // namespace

int cmd_ptx(const std::vector<std::string>& argv) {
  Args a(argv,
         with_model_flags({{"out", "directory to write the kernels to (required)"},
                           {"batch", "sequences per step (default 16)"},
                           {"sm", "target architecture: 80 or 90 (default 90)"}},
                          true),
         "usage: kiln ptx --out DIR [options]\n\nWrites the PTX of every kernel of one GPT training step (AdamW) "
         "and an index.");
  if (a.help()) {
    a.print_help();
    return 0;
  }
  const std::filesystem::path out = a.required("out");
  const int sm = static_cast<int>(a.integer("sm", 90));
  models::GPTConfig c = config_from_flags(a);
  const int64_t batch = a.integer("batch", 16);
  models::GPT model(c);
  optim::AdamW opt(model.parameters(), {});
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{batch, c.block_size});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>(i % c.vocab_size));
  Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
  Engine::current().plan_cache().set_gpu_target(true);  // the passes a GPU run would get
  Tensor loss = model.loss(x, y);
  loss.backward();
  opt.step();
  const Plan* step = Engine::current().plan_cache().largest();
  if (!step) throw Error("kiln ptx: the training step built no plan");
  const Circuit& circuit = step->program->circuit();

  std::vector<cuda::LoweredOp> lowered;
  for (size_t i = 0; i < circuit.ops().size(); ++i) lowered.push_back(cuda::lower(circuit, static_cast<int>(i)));
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
  index << "kernel\tprims\tgrid\tblock\tshared_bytes\tregisters\tspill_stores\tspill_loads\n";
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
    index << '\n';
  }
  if (!index) throw Error("kiln ptx: cannot write " + (out / "index.tsv").string());
  std::printf("%zu ops, %zu launches, %zu distinct kernels for sm_%d written to %s (index.tsv)\n", circuit.ops().size(),
              launches, kernels.size(), sm, out.c_str());
  return 0;
}

}  // namespace kiln::cli
