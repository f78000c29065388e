// `kiln bench`: the speed of a full training step (forward, backward, AdamW) for a GPT config,
// its FLOPs (2 m n k over every matmul of forward and backward, attention included), and the
// fraction of this machine's measured f32 GEMM rate (1024^3 through kiln's matmul, same thread
// count) it reaches (for the traced step, as training runs it; medians of step and GEMM timings
// taken in turns, so that both see the same load on a shared machine), next to the host time spent
// outside the executor when the step is recorded every time and when a traced step is replayed,
// and the page faults and tensor allocations per step.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/prims/builder.hpp>
#include <kiln/circuit/prims/cpu_gemm.hpp>
#include <kiln/circuit/prims/onednn_matmul.hpp>
#include <kiln/core/device.hpp>
#include <kiln/core/distributed.hpp>
#include <kiln/core/engine.hpp>
#include <kiln/core/step_stats.hpp>
#include <kiln/core/traced_step.hpp>
#include <kiln/train/adamw.hpp>

#include "args.hpp"
#include "bench_attention.hpp"
#include "bench_estimate.hpp"
#include "bench_gemm.hpp"
#include "commands.hpp"

namespace kiln::cli {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 2 m n k summed over the matmuls of a circuit.
double matmul_flops(const Circuit& c) {
  double flops = 0;
  for (const Op& op : c.ops()) {
    if (!op.is(PrimId::matmul)) continue;
    const Shape& out = c.info(op.outputs[0]).shape;
    const Shape& a = c.info(op.inputs[0]).shape;
    int64_t k = MatmulParams::of(op).transpose_a ? a[a.rank() - 2] : a[a.rank() - 1];
    flops += 2.0 * static_cast<double>(out.numel()) * static_cast<double>(k);
  }
  return flops;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A 1024^3 f32 GEMM through kiln's own matmul Prim (oneDNN's or Eigen's GEMM); gflops() runs it
// once and returns its rate.
class GemmProbe {
 public:
  GemmProbe() {
    ValueId a = c_.add_external({Shape{1024, 1024}, DType::f32}, ValueRole::Input);
    ValueId b = c_.add_external({Shape{1024, 1024}, DType::f32}, ValueRole::Input);
    Builder bl(c_);
    ValueId out = bl.matmul(a, b);
    program_ = std::make_unique<Program>(c_, std::vector<ValueId>{out});
    program_->set_adaptive_threads(false);  // the whole team, always: the machine's rate, not a governor's choice
    binds_ = {HostTensor::zeros(DType::f32, {1024, 1024}), HostTensor::zeros(DType::f32, {1024, 1024})};
    for (auto& t : binds_)
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i % 17) / 17.0 - 0.5);
    program_->run(binds_);  // warm up
  }
  double gflops() const {
    auto t0 = std::chrono::steady_clock::now();
    program_->run(binds_);
    return 2.0 * 1024 * 1024 * 1024 / seconds_since(t0) / 1e9;
  }

 private:
  Circuit c_;
  std::unique_ptr<Program> program_;
  std::vector<HostTensor> binds_;
};
constexpr double kMiB = 1 << 20;

// --plan-only: the step recorded and its plan made, never run (the engine in plan-only mode;
// the model initialized on the CPU, which the simulator would take minutes over for GPT-2
// small): what the step will hold in memory, in seconds. The CPU executor's workspace for a CPU
// device; for a CUDA one the GPU plan lowered (not launched) and its workspace.
int print_plan_memory(const std::function<std::vector<Tensor>()>& record, const double& flops,
                      const DeviceSelection& device) {
  auto t0 = std::chrono::steady_clock::now();
  record();  // the optimizer's step realizes: its plan is made, not run
  const Plan* plan = Engine::current().last_plan();
  const double made_in = seconds_since(t0);
  const StepStats stats = measure_step(*plan);
  std::printf("plan only (not run): %zu recorded ops -> %zu ops, made in %.0f ms\n", plan->recorded_ops,
              plan->optimized_ops, 1000 * made_in);
  std::printf("matmul FLOPs per step (forward + backward): %.3f GFLOP\n", flops / 1e9);
  const int checkpointed = plan->made_with.checkpointed_blocks;
  const std::string some_blocks = checkpointed >= 0 ? " in " + std::to_string(checkpointed) + " of " +
                                                          std::to_string(count_blocks(plan->recorded)) + " blocks"
                                                    : "";
  std::printf("recompute %s%s: %.2f MiB saved for the backward, %.3f GFLOP of matmuls recomputed\n",
              recompute_mode_name(recompute_mode(plan->made_with, plan->target)), some_blocks.c_str(),
              static_cast<double>(stats.saved_bytes) / kMiB, stats.recomputed_matmul_flops / 1e9);
  std::printf("persistent tensors the step reads: %.2f MiB (parameters, gradients, optimizer state)\n",
              static_cast<double>(stats.persistent_bytes) / kMiB);
  if (device.device == Device::CUDA) {
    const Program& p = *plan->program;
    const cuda::DeviceProgram dp(p.circuit(), p.outputs(), *device.runtime, plan->target);
    std::printf("GPU workspace: %.2f MiB for a live peak of %.2f MiB of intermediates; %zu kernels\n",
                static_cast<double>(dp.workspace_bytes()) / kMiB, static_cast<double>(dp.peak_live_bytes()) / kMiB,
                dp.kernels().size());
  } else {
    std::printf("CPU workspace: %.2f MiB for a live peak of %.2f MiB of intermediates\n",
                static_cast<double>(plan->program->workspace_bytes()) / kMiB,
                static_cast<double>(plan->program->peak_live_bytes()) / kMiB);
  }
  return 0;
}

// The exposed communication time: the median over turns of the traced step's time less the same
// step's with every all-reduce a local no-op of the same size (`--collectives noop`), the two
// taken in each turn (a shared machine's load changes within seconds). Each timed step starts
// after a barrier, so that a rank's head start is not counted as its collective's time. CPU steps
// (a GPU step's all-reduce is its device collective's).
void print_exposed_communication(TracedStep& traced, const HostTensor& ids, const std::shared_ptr<Communicator>& real,
                                 int64_t steps) {
  const std::shared_ptr<Communicator> noop = with_noop_collectives(real);
  std::vector<double> with_ms, without_ms, exposed_ms, waited_ms;
  for (int64_t i = 0; i < std::max<int64_t>(steps, 5); ++i) {
    double ms[2];
    for (int k = 0; k < 2; ++k) {
      set_world(k == 0 ? real : noop);
      real->barrier();
      const double waited = real->seconds_waited();
      auto t0 = std::chrono::steady_clock::now();
      traced.run({ids, ids})[0].item();
      ms[k] = 1000 * seconds_since(t0);
      if (k == 0) waited_ms.push_back(1000 * (real->seconds_waited() - waited));
    }
    set_world(real);
    with_ms.push_back(ms[0]);
    without_ms.push_back(ms[1]);
    exposed_ms.push_back(ms[0] - ms[1]);
  }
  std::printf(
      "exposed communication: %.2f ms a step (median of %zu turns: step %.2f ms, with no-op collectives %.2f ms; "
      "waiting for collectives %.2f ms; %d ranks through %s)\n",
      median(exposed_ms), exposed_ms.size(), median(with_ms), median(without_ms), median(waited_ms), real->size(),
      real->backend().c_str());
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  Args a(argv,
         with_tune_flag(with_target_flags(with_precision_flag(with_thread_flag(with_model_flags(
             {{"batch", "sequences per step (default 16)"},
              {"steps", "timed steps (default 20)"},
              {"dropout", "gpt: dropout probability, attention's included (default 0)"},
              {"device", "cpu (default), cuda, auto or sim (the CUDA back end on the SIMT simulator)"},
              {"collectives",
               "auto (default: none in one process), nccl or host: the step averages its gradients "
               "through that device collective, as data parallel runs do; noop (CPU, under mpirun): "
               "every all-reduce a local no-op"},
              {"bucket-mb", "under mpirun: gradients averaged in buckets of at most this many MiB (default 25)"},
              {"gemm",
               "time kiln's matmul alone instead: comma-separated N (N^3) or MxNxK "
               "shapes, e.g. 1024,4096,8192x2304x768"},
              {"attention",
               "time causal attention forward + backward alone instead: comma-separated "
               "BxHxTxD shapes, e.g. 8x12x1024x64 (--passes -fuse_attention: unfused)"},
              {"skip-non-finite",
               "guard AdamW's update with the loss's and gradient norm's finiteness, as "
               "kiln train does"},
              {"estimate",
               "h100 or h200, with --device sim: instead of timing, run the step (or --gemm, --attention) once "
               "with blocks sampled and print each kernel's estimated time on that GPU"},
              {"sample-blocks", "with --estimate: blocks simulated per launch, spread over its grid (default 8)"},
              {"plan-only",
               "make the step's plan without running it and print its memory (the CPU workspace, "
               "or the GPU plan's with --device cuda or sim)"}},
             true))))),
         "usage: kiln bench [options]\n\nTimes full training steps of a GPT or a Llama (--model llama) (AdamW) on the "
         "CPU or the GPU.\n"
         "GPT-2 small: --layers 12 --heads 12 --embd 768 --block 1024 --vocab-size 50257 --batch 8",
         with_target_switches(with_model_switches({"skip-non-finite", "plan-only"})));
  if (a.help()) {
    a.print_help();
    return 0;
  }
  apply_thread_flag(a);
  apply_precision_flag(a);
  // Under mpirun every rank runs the step on the same batch, its gradients averaged; rank 0 prints.
  join_ranks();
  if (world().rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    throw Error("kiln bench: rank " + std::to_string(world().rank()) + " could not silence its output");
  const int64_t batch = a.integer("batch", 16, 1), steps = a.integer("steps", 20, 1);
  const DeviceSelection device = parse_device(a.str("device", "cpu"));
  Engine::current().set_device(device.device, device.runtime);
  apply_target_flags(a);
  const TuneMode tune = apply_tune_flag(a, device.runtime);
  // --collectives nccl: the step with NCCL in its graph, in one process
  const std::shared_ptr<Communicator> ranks = shared_world();
  apply_collectives_flag(a, device);
  const std::optional<EstimateRequest> estimate = estimate_flags(a, device);
  if (a.has("gemm")) return bench_gemm(a.str("gemm", ""), steps, estimate);
  if (a.has("attention")) return bench_attention(a.str("attention", ""), steps, estimate);
  const bool plan_only = a.has("plan-only");
  // The model made on the CPU where the step is not run on the device (random numbers drawn on
  // the simulator would take minutes at GPT-2's size).
  if (plan_only || estimate) Engine::current().set_device(Device::CPU);
  manual_seed(1);
  std::unique_ptr<models::CausalLM> model_ptr = model_from_flags(a, 0, a.real("dropout", 0.0, 0.0, 1.0));
  models::CausalLM& model = *model_ptr;
  const models::ModelAttributes attrs = model.attributes();
  const int64_t block_size = model.block_size(), vocab_size = model.vocab_size();
  optim::AdamWOptions adamw;
  adamw.skip_non_finite = a.has("skip-non-finite");
  adamw.bucket_bytes = static_cast<size_t>(a.real("bucket-mb", 25.0, 1.0 / 1024, 1 << 20) * (1 << 20));
  optim::AdamW opt(model.parameters(), adamw);
  HostTensor ids = HostTensor::zeros(DType::i32, Shape{batch, block_size});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.set(i, static_cast<double>((i * 7919) % vocab_size));
  Tensor x = Tensor::from_host(ids), y = Tensor::from_host(ids);
  double flops = 0;
  auto record = [&] {
    Tensor loss = model.loss(x, y);
    loss.backward();
    flops = matmul_flops(Engine::current().pending());
    opt.step(0.0, loss);
    return std::vector<Tensor>{loss};
  };
  // Mean step time and host overhead: the step's time outside its executor (recording, hashing,
  // lookup, binding) on the CPU; on the GPU, outside the device's work (from the first launch to
  // the synchronize after the last), so binding, uploads and downloads count as overhead too.
  // Medians: the thread governor's probes (a few runs at another team size, ThreadGovernor)
  // fall inside a short timing window, and a mean over 8 steps would count them as the step.
  struct Timing {
    double step_ms = 0, outside_ms = 0;
    ProcessCounters counters;  // summed over the timed steps
  };
  auto time_steps = [&](const std::function<void()>& one_step) {
    for (int i = 0; i < 3; ++i) one_step();  // warm up: plan built, caches hot
    std::vector<double> step_ms, outside_ms;
    Timing t;
    for (int64_t i = 0; i < steps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      one_step();
      step_ms.push_back(1000 * seconds_since(t0));
      outside_ms.push_back(step_ms.back() - Engine::current().stats().last_work_ms);
      const ProcessCounters& c = Engine::current().stats().last_counters;
      t.counters.minor_faults += c.minor_faults;
      t.counters.storage_allocations += c.storage_allocations;
      t.counters.storage_bytes += c.storage_bytes;
    }
    t.step_ms = median(step_ms);
    t.outside_ms = median(outside_ms);
    return t;
  };
  if (plan_only) {
    Engine::current().set_device(device.device, device.runtime);
    Engine::current().set_plan_only(true);
    return print_plan_memory(record, flops, device);
  }
  if (estimate) {
    Engine::current().set_device(device.device, device.runtime);
    Engine::current().set_target(estimate->target);
    const SampledBlocks sampled(estimate);
    TracedStep traced({x, y}, record);
    print_estimate(traced, {ids, ids}, *estimate, "the training step");
    return 0;
  }
  Engine::current().set_tune_next_plan(tune == TuneMode::on);  // the first step's plan (--tune on)
  Timing recorded = time_steps([&] { record()[0].item(); });
  TracedStep traced({x, y}, record);
  Timing replayed = time_steps([&] { traced.run({ids, ids})[0].item(); });
  const double per_step = replayed.step_ms / 1000;
  double achieved = flops / per_step / 1e9;
  std::printf("config %s L%lld H%lld C%lld T%lld B%lld V%lld, AdamW%s, %s matmuls, on %s\n",
              model.architecture().c_str(), static_cast<long long>(attrs.get_int("n_layer")),
              static_cast<long long>(attrs.get_int("n_head")), static_cast<long long>(attrs.get_int("n_embd")),
              static_cast<long long>(block_size), static_cast<long long>(batch), static_cast<long long>(vocab_size),
              adamw.skip_non_finite ? " skipping non-finite steps" : "", precision_name(Engine::current().precision()),
              device.device == Device::CUDA ? Engine::current().last_plan()->device->runtime().device_name().c_str()
                                            : "the CPU");
  std::printf("target: %s\n", Engine::current().target().str().c_str());
  if (device.device != Device::CUDA) {
    bool emulated = false;
    std::string kernel;  // which of oneDNN's kernels a step-sized bf16 product gets (AMX, AVX512-BF16, ...)
    if (Engine::current().target().cpu_bf16 == CpuBf16Products::onednn)
      kernel = " (oneDNN kernel " +
               OneDnnMatmul(DType::bf16, Shape{1024, 768}, false, Shape{768, 768}, false, Shape{1024, 768}).kernel() +
               ")";
    std::printf("CPU bf16: %s%s\n", cpu_bf16_summary(Engine::current().target(), &emulated).c_str(), kernel.c_str());
    if (emulated && Engine::current().precision() == Precision::bf16)
      log_cpu_bf16(Engine::current().target(), Precision::bf16);  // the same line, as a warning
  }
  const char* outside = device.device == Device::CUDA ? "outside the device's work" : "outside the executor";
  const auto n = static_cast<double>(steps);
  for (const auto& [how, t] : {std::pair{"recorded every step", recorded}, std::pair{"traced, replayed", replayed}})
    std::printf(
        "step (%s): %.2f ms median, %.0f tokens/s; host time %s %.3f ms (%.2f%%); per step %.1f minor page faults, "
        "%.1f tensor allocations (%.1f KiB)\n",
        how, t.step_ms, static_cast<double>(batch * block_size) / (t.step_ms / 1000), outside, t.outside_ms,
        100 * t.outside_ms / t.step_ms, static_cast<double>(t.counters.minor_faults) / n,
        static_cast<double>(t.counters.storage_allocations) / n,
        static_cast<double>(t.counters.storage_bytes) / n / 1024);
  std::printf("matmul FLOPs per step (forward + backward): %.3f GFLOP -> %.1f GFLOP/s\n", flops / 1e9, achieved);
  if (world().size() > 1 && device.device != Device::CUDA && a.str("collectives", "auto") != "noop")
    print_exposed_communication(traced, ids, ranks, steps);
  if (device.device == Device::CUDA) return 0;
  const Program& program = *Engine::current().last_plan()->program;
  std::printf("CPU workspace: %.2f MiB for a live peak of %.2f MiB of intermediates; %zu ops computed once per plan\n",
              static_cast<double>(program.workspace_bytes()) / (1 << 20),
              static_cast<double>(program.peak_live_bytes()) / (1 << 20), program.constant_ops());
  // Steps and GEMMs in turns: a shared machine's load changes within seconds, and a ratio of
  // timings taken under different loads would measure the load. Both at one team size (the
  // thread governor's probes would time some steps at another).
  const int saved_threads = fixed_num_threads();
  const int team = saved_threads > 0 ? saved_threads : omp_get_max_threads();
  set_num_threads(team);
  const GemmProbe gemm;
  std::vector<double> step_s, rates;
  for (int64_t i = 0; i < std::max<int64_t>(steps, 9); ++i) {  // 9 turns at least: a median of few is noise
    auto t0 = std::chrono::steady_clock::now();
    traced.run({ids, ids})[0].item();
    step_s.push_back(seconds_since(t0));
    rates.push_back(gemm.gflops());
  }
  set_num_threads(saved_threads);
  const double step_rate = flops / median(step_s) / 1e9, rate = median(rates);
  std::printf(
      "f32 GEMM 1024^3 on this machine (kiln's matmul, %s, %d threads): %.1f GFLOP/s (median of %lld, between "
      "steps)\n",
      cpu_gemm_library(), team, rate, static_cast<long long>(rates.size()));
  std::printf("step reaches %.1f%% of the GEMM rate (median step %.2f ms in the same turns: %.1f GFLOP/s)\n",
              100 * step_rate / rate, 1000 * median(step_s), step_rate);
  return 0;
}

}  // namespace kiln::cli
