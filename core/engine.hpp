// Engine: owns the Circuit being recorded, the persistent arenas, the plan cache, the RNG seed
// and the scope stack. One engine per thread (Engine::current()). realize() runs the pending
// Circuit as one unit: forward, backward and updates together. Defined by responsibility:
// recording in engine_record.cpp, running steps and traces in engine_run.cpp, persistent
// storage in engine_storage.cpp, the rest (device, seed, scopes) in engine.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <kiln/circuit/prims/builder.hpp>
#include <kiln/core/arena.hpp>
#include <kiln/core/device.hpp>
#include <kiln/core/plan_cache.hpp>
#include <kiln/core/precision.hpp>
#include <kiln/core/process_counters.hpp>
#include <kiln/core/tensor.hpp>

namespace kiln {

struct TensorImpl {
  class Engine* engine = nullptr;  // the (thread's) engine that made it; others refuse it
  ValueInfo info;
  std::string name;
  // Pending: a value of the recording with this epoch.
  uint64_t epoch = 0;
  ValueId pending = kNoValue;
  // Realized: host data (a snapshot; never aliases an arena).
  HostTensor data;
  // Persistent: an arena slot, and for parameters the slot of the gradient.
  int32_t slot = -1;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
};

struct EngineStats {
  uint64_t realizations = 0;  // steps run, replays included
  uint64_t plans_built = 0;
  uint64_t cache_hits = 0;
  uint64_t replays = 0;          // traced steps run again (no recording, no lookup)
  double last_hash_bind_ms = 0;  // structural hash + cache lookup + binding of the last step
  double last_plan_ms = 0;       // passes + planning (0 on a cache hit)
  double last_run_ms = 0;        // execution
  // The step's own work within that: the Eigen executor's run, or on the GPU from the first
  // launch to the synchronize after the last (host binding and copies excluded).
  double last_work_ms = 0;
  size_t last_recorded_ops = 0, last_executed_ops = 0;
  // Page faults and tensor storage allocated from binding the last step to handing out its
  // results (a planned CPU step after the first: none but its outputs and per-run inputs).
  ProcessCounters last_counters;
};

class Engine {
 public:
  static Engine& current();
  Engine();

  // --- recording (used by Tensor) ---------------------------------------------------------
  Builder builder();
  // Ops recorded from now until the step is realized belong to phase p (statistics only;
  // backward() sets Backward, an optimizer's step() Update).
  void mark_phase(Phase p) { rec_.circuit.set_recording_phase(p); }
  const Circuit& pending() const { return rec_.circuit; }
  // The id of t in the pending circuit; a realized tensor becomes an input value, a
  // persistent one a persistent value (its latest assigned version within this step).
  ValueId value_of(const Tensor& t);
  // Wraps a new pending value in a Tensor handle. With deliver false the handle is not given
  // its value when the step is realized (an input made per run needs no value back).
  Tensor wrap(ValueId id, bool deliver = true);
  // Records value into the persistent tensor t.
  void assign(const Tensor& t, const Tensor& value);
  // Key (i32 [2]) and a fresh stream offset (i32 []) as runtime inputs for a random op.
  std::pair<ValueId, ValueId> next_random_stream();
  // A runtime input whose value `write` stores into the tensor it is given (of `info`'s dtype
  // and shape; the same buffer every run unless a handle still shares it) each time the recorded
  // step runs (each replay of a traced step included), in recording order, after the step's run
  // hooks: per-step values computed by host code, such as a learning rate or a random stream's
  // offset.
  using InputWriter = std::function<void(HostTensor& value)>;
  ValueId add_computed_input(ValueInfo info, const std::string& name, InputWriter write);
  // Host work done each time the recorded step runs, before its computed inputs are made (an
  // optimizer counting its steps). Hooks run in the order they were recorded.
  void on_each_run(std::function<void()> hook);

  // A value of `info` that stands for an argument of a function being traced into a Circuit of
  // its own (a custom VJP rule, core/user_prim.cpp): an input of the pending recording that is
  // never bound. Realizing a recording that holds one is an error naming `traced_for`.
  Tensor placeholder(const ValueInfo& info, const std::string& name, const std::string& traced_for);

  Tensor new_persistent(ArenaKind kind, const std::string& name, const HostTensor& init, bool requires_grad);
  void backward(const Tensor& loss);
  // Moves a persistent tensor (and its gradient buffer) to new arena slots of `dtype`, values
  // converted; every handle sharing it sees the change. The old slots stay unused.
  void convert_persistent(const std::shared_ptr<TensorImpl>& t, DType dtype);
  std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt);

  // --- realization ------------------------------------------------------------------------
  // Runs everything recorded so far; live handles get their values. No-op when empty.
  void realize();
  // While on, realize() makes (or finds) each step's plan, keeps it as last_plan() and runs
  // nothing: the recording is dropped, persistent tensors keep their values, and the step's
  // handles never get values (reading one is an error). No kernel is tuned (a pending
  // set_tune_next_plan waits for a plan that runs), and a traced step cannot be made meanwhile.
  // `kiln bench --plan-only` reads a step's memory so.
  void set_plan_only(bool on) { plan_only_ = on; }
  // The current contents of a persistent tensor (a copy).
  HostTensor read_persistent(const TensorImpl& t) const;
  // Overwrites a persistent tensor with `values` (same shape; converted to its dtype).
  void write_persistent(const TensorImpl& t, const HostTensor& values);

  // --- settings and state -----------------------------------------------------------------
  void manual_seed(uint64_t seed);
  // Where realize() runs steps. CUDA runs them through `runtime` (default: cuda_runtime());
  // throws kiln::Error when there is none. The Target's device fields become the device's (its
  // sm, fake or real, the CPU's features); its choices stay.
  void set_device(Device d, cuda::Runtime* runtime = nullptr);
  Device device() const { return device_; }
  // What plans are made for from now on (circuit/ir/target.hpp): part of every plan's key. A
  // CUDA Target while the device is the CPU plans for the GPU (its passes) and runs the plans on
  // the CPU executor: `kiln ptx` and the kernel-count tests look at GPU plans that way.
  void set_target(const Target& t) { target_ = t; }
  // `--tune on` (core/tuning.hpp): before the next plan is made (a run's first step), its CPU
  // kernels that the Target's tuned choices lack are tuned (and written to the device's tuning
  // file), and the Target takes the new choices, fixed from then on: later plans (a validation
  // pass) are made with them and tune nothing, so a traced step's Target never changes under it.
  // Never in deterministic mode (the request lapses with that plan too).
  void set_tune_next_plan(bool on) { tune_next_plan_ = on; }
  const Target& target() const { return target_; }
  // The passes switched off from now on (circuit/passes/pipeline.hpp); part of every plan's key.
  void set_pipeline(PipelineOptions p) {
    check_pipeline_options(p);
    pipeline_ = std::move(p);
  }
  const PipelineOptions& pipeline() const { return pipeline_; }
  // Deterministic mode (off by default; Target::deterministic): GPU steps use no float atomics
  // (scatter sums in source order; every other reduction is already a fixed tree) and CPU steps
  // a fixed thread count, so a run, and a run resumed from a checkpoint, repeats bit for bit.
  // Costs the embedding gradient's parallelism.
  void set_deterministic(bool on) { target_.deterministic = on; }
  // The precision policy of the matmuls recorded from now on (core/precision.hpp).
  void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }
  uint64_t seed() const { return seed_; }
  uint64_t random_counter() const { return random_counter_; }
  void set_random_counter(uint64_t c) { random_counter_ = c; }
  bool accumulate_gradients = false;
  void push_scope(const std::string& name, bool absolute = false);
  void pop_scope();
  const std::string& scope() const { return scope_path_; }
  const EngineStats& stats() const { return stats_; }
  // The plan the last realization or replay ran (held, so eviction cannot free it), or null.
  const Plan* last_plan() const { return last_plan_.get(); }
  PlanCache& plan_cache() { return cache_; }
  ArenaSet& arenas() { return arenas_; }

  // Moves the pending recording out (and starts an empty one), or puts one back: the user
  // gradient check records a function in isolation this way.
  struct Recording {
    Circuit circuit;
    std::vector<HostTensor> bound;       // per external of circuit; persistent ones empty
    std::vector<int32_t> external_slot;  // per external: arena slot or -1
    // Realized tensors bound as inputs; held so that no other tensor can take their address.
    std::unordered_map<const TensorImpl*, std::pair<std::shared_ptr<TensorImpl>, ValueId>> realized_inputs;
    std::unordered_map<int32_t, bool> grad_written;        // grad slots assigned by a backward() of this step
    std::unordered_map<int32_t, ValueId> slot_version;     // arena slot -> latest version id
    std::vector<std::weak_ptr<TensorImpl>> handles;        // pending handles of this recording
    std::vector<std::function<void()>> run_hooks;          // see on_each_run
    std::vector<std::pair<size_t, InputWriter>> computed;  // external index, writer
    std::string traced_for;  // non-empty: holds placeholders for this function; never realized
    uint64_t epoch = 0;
  };
  Recording take_recording();
  void restore_recording(Recording rec);
  // Prepares one run of a recording: runs its hooks, makes its computed inputs, and returns the
  // bindings of its externals: arena views for persistent values, made current unless the run is
  // on the device (which uses the device copies where they are newer).
  std::vector<HostTensor> prepare_run(Recording& rec, bool on_device = false);

  // --- traced steps (core/traced_step.hpp) ------------------------------------------------
  // What a traced step replays: the plan of its one realization, the recording's bindings,
  // hooks and computed inputs, and the handles that took its results (requested order).
  struct Trace {
    std::shared_ptr<const Plan> plan;
    Recording rec;
    std::vector<std::weak_ptr<TensorImpl>> results;
    Device device = Device::CPU;
    cuda::Runtime* runtime = nullptr;
  };
  // Between begin_trace and end_trace the engine keeps the realization that happens; end_trace
  // throws unless exactly one (non-empty) step was realized.
  void begin_trace();
  Trace end_trace();
  // Runs a trace's plan again with its recording's bindings (rec.bound may have been changed
  // by the caller); results go to the handles still alive. Pending work is realized first.
  void replay(Trace& trace);

 private:
  ValueId add_input(HostTensor data, const std::string& name);
  // Runs `plan` on the engine's device and gives each live handle (null: none) its result.
  // external_slot: per external, its arena slot or -1 (the device keeps those slots resident).
  void execute(const Plan& plan, const std::vector<HostTensor>& binds, const std::vector<int32_t>& external_slot,
               const std::vector<std::shared_ptr<TensorImpl>>& live);
  // The host copy of an arena slot, downloaded first when the device copy is newer.
  HostTensor host_view(int32_t slot) const;
  Recording rec_;
  uint64_t next_epoch_ = 1;
  std::unordered_map<int32_t, std::weak_ptr<TensorImpl>> owners_;  // arena slot -> tensor
  ArenaSet arenas_;
  PlanCache cache_;
  EngineStats stats_;
  std::shared_ptr<const Plan> last_plan_;
  // Tracing: realizations seen since begin_trace, and the last one's trace.
  bool tracing_ = false;
  int traced_realizations_ = 0;
  Trace trace_;
  Target target_ = cpu_target();
  PipelineOptions pipeline_;
  bool tune_next_plan_ = false;
  bool plan_only_ = false;  // set_plan_only
  Device device_ = Device::CPU;
  cuda::Runtime* runtime_ = nullptr;
  // On the GPU: device copies of persistent tensors, kept between steps.
  std::unique_ptr<cuda::ResidentBuffers> resident_;
  Precision precision_ = Precision::f32;
  uint64_t seed_ = 0x5EED;
  uint64_t random_counter_ = 0;
  std::vector<std::string> scopes_;  // the path before each push
  std::string scope_path_;
};

// Sets the current engine's precision policy for a scope and restores the previous one on exit
// (an exception included): `ScopedPrecision bf16(Precision::bf16);`.
class ScopedPrecision {
 public:
  explicit ScopedPrecision(Precision p) : saved_(Engine::current().precision()) { Engine::current().set_precision(p); }
  ~ScopedPrecision() { Engine::current().set_precision(saved_); }
  ScopedPrecision(const ScopedPrecision&) = delete;
  ScopedPrecision& operator=(const ScopedPrecision&) = delete;

 private:
  Precision saved_;
};

// Seeds the current engine's Philox streams (and nothing else: kiln has no other RNG).
void manual_seed(uint64_t seed);

// Pushes a module path component for the ops recorded in its lifetime ("h.0" then "attn"
// gives "h.0.attn"), so errors and dumps name the layer. An absolute scope replaces the path
// (a module knows its whole path, "model.layers.1.self_attn", whichever code calls it).
class Scope {
 public:
  explicit Scope(const std::string& name, bool absolute = false) { Engine::current().push_scope(name, absolute); }
  ~Scope() { Engine::current().pop_scope(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

}  // namespace kiln
