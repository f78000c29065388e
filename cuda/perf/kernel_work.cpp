// The fake driver's counts as the performance model's work (kernel_work.hpp).
#include <algorithm>

#include <kiln/cuda/kir/ptx_printer.hpp>
#include <kiln/cuda/kir/ptxas.hpp>
#include <kiln/cuda/perf/kernel_work.hpp>

namespace kiln::perf {

double compulsory_bytes(const Circuit& c, const Op& op) {
  std::vector<ValueId> seen;
  double bytes = 0;
  for (const std::vector<ValueId>* values : {&op.inputs, &op.outputs})
    for (ValueId v : *values) {
      if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
      seen.push_back(v);
      bytes += static_cast<double>(c.info(v).nbytes());
    }
  return bytes;
}

KernelWork work_per_launch(const cuda::FakeKernelStats& s, const cuda::Launch& launch, int registers,
                           double compulsory_bytes) {
  const double n = static_cast<double>(std::max<int64_t>(s.launches, 1));
  KernelWork w;
  w.blocks = launch.grid.count();
  w.threads = static_cast<uint32_t>(launch.block.count());
  w.registers = registers;
  w.shared_bytes = launch.kernel->shared_bytes();
  w.instructions = static_cast<double>(s.instructions) / n;
  w.fp32_flops = static_cast<double>(s.fp32_flops) / n;
  w.tensor_flops = static_cast<double>(s.tensor_flops - s.tf32_tensor_flops) / n;
  w.tf32_tensor_flops = static_cast<double>(s.tf32_tensor_flops) / n;
  // Through L2 in 32-byte sectors: a request's lanes that touch one sector share it, scattered
  // lanes touch one each (the fake driver counts them while it counts anything).
  w.global_bytes = s.global_requests > 0 ? static_cast<double>(32 * s.global_sectors + s.tensor_copy_bytes) / n
                                         : static_cast<double>(s.global_load_bytes + s.global_store_bytes) / n;
  w.shared_wavefronts = static_cast<double>(s.shared_wavefronts) / n;
  w.compulsory_bytes = compulsory_bytes;
  return w;
}

std::vector<KernelRowEstimate> estimate_program(const cuda::DeviceProgram& program,
                                                const std::map<std::string, cuda::FakeKernelStats>& counted,
                                                const DeviceLimits& d, int sm) {
  struct Kernel {
    const cuda::Launch* launch = nullptr;
    std::string prims;
    int64_t launches = 0;
    double compulsory = 0;  // summed over its launches
  };
  const Circuit& c = program.circuit();
  std::map<int, int64_t> launches_of_op;
  for (const auto& k : program.kernels()) ++launches_of_op[k.op];
  std::map<std::string, Kernel> kernels;
  for (const auto& k : program.kernels()) {
    Kernel& kernel = kernels[k.launch->kernel->name];
    kernel.launch = k.launch;
    if (kernel.prims.find(k.prim) == std::string::npos) kernel.prims += (kernel.prims.empty() ? "" : ",") + k.prim;
    ++kernel.launches;
    kernel.compulsory += compulsory_bytes(c, c.ops()[static_cast<size_t>(k.op)]) /
                         static_cast<double>(launches_of_op[k.op]);
  }
  const bool have_ptxas = !cuda::find_ptxas().empty();
  std::vector<KernelRowEstimate> rows;
  for (const auto& [name, kernel] : kernels) {
    const auto it = counted.find(name);
    if (it == counted.end() || it->second.launches == 0) continue;  // an empty grid: not launched
    int registers = 0;
    if (have_ptxas)
      if (const cuda::PtxasResult r = cuda::run_ptxas(kir::print_ptx(*kernel.launch->kernel, sm), sm); r.ok)
        registers = r.registers;
    KernelRowEstimate row;
    row.kernel = name;
    row.prims = kernel.prims;
    row.launches = kernel.launches;
    row.work = work_per_launch(it->second, *kernel.launch, registers,
                               kernel.compulsory / static_cast<double>(kernel.launches));
    row.estimate = estimate(row.work, d);
    rows.push_back(std::move(row));
  }
  std::sort(rows.begin(), rows.end(), [](const KernelRowEstimate& a, const KernelRowEstimate& b) {
    return a.estimate.seconds * static_cast<double>(a.launches) > b.estimate.seconds * static_cast<double>(b.launches);
  });
  return rows;
}

}  // namespace kiln::perf
