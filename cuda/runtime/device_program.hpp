// DeviceProgram: a Circuit lowered to kernel launches and run through a Runtime (a GPU, or the
// fake driver's simulator). Same contract as the Eigen executor's Program::run: bindings per
// external, results per requested output, and persistent buffers written by assign ops only
// after the whole step succeeded on the device: into the bound host buffers, or, for persistent
// tensors resident on the device (Residency), by making the step's buffer their device copy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/runtime/resident.hpp>
#include <kiln/cuda/runtime/runtime.hpp>

namespace kiln::cuda {

struct DeviceRunStats {
  int64_t launches = 0;
  size_t peak_bytes = 0;  // device bytes held by this run: its workspace and its own buffers at their peak
  size_t uploaded_bytes = 0, downloaded_bytes = 0;  // host <-> device copies made by the run
  int64_t uploads = 0, downloads = 0;               // ... and how many
  double device_ms = 0;      // from the first command's launch to the end of the synchronize after the last
  bool graph = false;        // the kernels ran as one CUDA graph
  bool graph_built = false;  // ... built for this run (a command list not seen before)
};

// Persistent externals kept on the device between runs (cuda/runtime/resident.hpp): keys[i] >= 0 names
// external i's device copy in `buffers` (its host binding is uploaded only when there is none,
// and an assign replaces the device copy instead of writing the host binding); -1 is an input,
// uploaded each run. No buffers: every binding is uploaded and assigns are committed to the host.
struct Residency {
  ResidentBuffers* buffers = nullptr;
  std::vector<int32_t> keys;
};

class DeviceProgram {
 public:
  // Lowers every op (errors name the op and layer), loads every kernel through `rt` and plans
  // the run's memory: one workspace, kept between runs, holds every intermediate, input, scratch
  // and status buffer at a fixed offset (circuit/exec/memory_plan.hpp); values assigned to persistent
  // tensors get buffers of their own (they become the tensors' device copies). On a runtime with
  // exact block sizes (the fake driver's bounds checks) every buffer is allocated on its own.
  // Lowered for `target` (its device fields should be rt's: device_target(rt)); without one, for
  // rt's device with the default choices.
  DeviceProgram(Circuit circuit, std::vector<ValueId> outputs, Runtime& rt, const Target& target);
  DeviceProgram(Circuit circuit, std::vector<ValueId> outputs, Runtime& rt);
  ~DeviceProgram();
  DeviceProgram(const DeviceProgram&) = delete;
  DeviceProgram& operator=(const DeviceProgram&) = delete;

  std::vector<HostTensor> run(const std::vector<HostTensor>& bindings, const Residency& residency = {});

  const Circuit& circuit() const { return circuit_; }
  Runtime& runtime() const { return rt_; }
  const Target& target() const { return target_; }
  // False once the runtime it was lowered for is destroyed (another may then take its address).
  bool runtime_alive() const { return !runtime_alive_.expired(); }
  // One entry per launch, in launch order.
  struct KernelInfo {
    int op = 0;
    std::string prim;
    const Launch* launch = nullptr;
    int registers = -1;
  };
  std::vector<KernelInfo> kernels() const;
  // The back end's own dump: each op with its lowering, kernels, grids and blocks.
  std::string dump() const;
  const DeviceRunStats& last_run() const { return last_run_; }
  // The planned workspace (0 without a static plan), and the most bytes of it live at once.
  size_t workspace_bytes() const { return workspace_bytes_; }
  size_t peak_live_bytes() const { return peak_live_bytes_; }

 private:
  Circuit circuit_;
  std::vector<ValueId> outputs_;
  Runtime& rt_;
  Target target_;
  std::vector<LoweredOp> lowered_;
  std::vector<std::vector<LoadedKernel>> loaded_;  // per op, per launch
  std::vector<ValueId> root_;                      // value -> the value whose buffer it uses
  std::vector<int> assign_target_;                 // per op: the external an assign writes, or -1
  std::vector<std::vector<ValueId>> free_after_;   // per op: buffers (roots) dead after it
  std::vector<int> status_slot_;                   // per op: its status words, or -1
  int status_slots_ = 0;
  DeviceRunStats last_run_;
  // The phases of run(), in its order, on one run's state (defined in device_program.cpp).
  struct RunState;
  // Chooses, for each assigned resident tensor (its last assign), the root computed into its
  // spare buffer (st.into_spare) or copied there after the step (st.copies); st.assigned: the
  // keys to flip once the step has succeeded.
  void choose_spares(RunState& st) const;
  // Gives value v its buffer: the spare it is computed into, its place in the workspace, or one
  // of its own of `bytes` held by st.buf.
  CUdeviceptr place(RunState& st, ValueId v, size_t bytes) const;
  // Places the non-resident externals and uploads their bindings (packed in staging_ and sent
  // in one copy where they lie together in the workspace).
  void upload_inputs(RunState& st);
  // Places the status words (st.status) and every op's outputs and scratch, releasing buffers
  // as they die, and lists the run's commands in st.commands, in order.
  void build_commands(RunState& st);
  // Op i's part of build_commands (an op that is not an alias): its zeroings, launches and
  // collective; its scratch buffers of its own are released after them.
  void op_commands(RunState& st, size_t i);
  // Op i's launch k as a command, its arguments resolved to addresses (scratch: op i's).
  DeviceCommand launch_command(RunState& st, size_t i, size_t k, const std::vector<CUdeviceptr>& scratch);
  // The device address of the run's next tensor map (st.maps counts them), map m of op i:
  // the entry encoded over the same buffer in an earlier run, else the one not used last,
  // encoded now (tensor_maps_current_ then false).
  CUdeviceptr tensor_map_arg(RunState& st, size_t i, const TensorMapArg& m);
  // Reads the status words at `status` and throws, naming the op, for the first index error.
  void check_status(CUdeviceptr status) const;
  // After a successful step: writes the assigned tensors into their host bindings, copies the
  // resident ones' values into their spares (st.copies) and flips the spares in.
  void commit(RunState& st) const;
  // Runs the commands in order (as a CUDA graph when graphs are on); returns the kernels run.
  int64_t execute(const std::vector<DeviceCommand>& commands);
  bool has_collectives_ = false;   // ops with a collective between ranks (LoweredOp::collective)
  bool collectives_warm_ = false;  // a run without a graph has called a collective
  // With several ranks the process's device collective must span them; throws naming op `op`.
  void require_device_collective(int op) const;
  // The static memory plan: offsets in the workspace per value root (kUnplanned: a buffer of its
  // own), per op per scratch buffer, and of the status words.
  static constexpr size_t kUnplanned = ~size_t{0};
  void plan_workspace();
  bool static_memory_ = false;
  std::vector<size_t> planned_offset_;
  std::vector<std::vector<size_t>> scratch_offset_;
  size_t status_offset_ = 0, workspace_bytes_ = 0, peak_live_bytes_ = 0;
  // The inputs (externals that are not persistent) lie together in the workspace, so a run
  // uploads them in one copy: their first byte, and a host buffer to pack them in.
  size_t inputs_offset_ = 0;
  std::vector<uint64_t> staging_;
  CUdeviceptr workspace_ = 0;  // allocated by the first run, freed with the program
  // The launches' tensor maps (ArgRef::Kind::TensorMap), in the order the commands take them,
  // two entries each: a step's assigned resident tensors alternate between two buffers, so each
  // map is encoded over a buffer once and then found again (tensor_map_over_: the address each
  // entry was encoded over, 0 for none; tensor_map_last_: the entry a map took last run, the
  // other one being replaced by a new buffer). Uploaded in one copy before the commands run where
  // the device's copy is not current.
  std::vector<CUtensorMap> tensor_maps_;
  std::vector<CUdeviceptr> tensor_map_over_;
  std::vector<uint8_t> tensor_map_last_;
  bool tensor_maps_current_ = false;
  CUdeviceptr tensor_maps_at_ = 0;           // allocated with the program when it has any
  std::weak_ptr<const void> runtime_alive_;  // a program may outlive its runtime (a test's)
  // Replay as CUDA graphs (static memory plan, a driver with graphs, Target::cuda_graphs):
  // the graphs of the latest command lists, at most two (a step's resident tensors alternate
  // between two address sets), the oldest destroyed first.
  bool use_graphs_ = false;
  struct CachedGraph {
    std::vector<DeviceCommand> commands;
    Runtime::Graph graph;
  };
  std::vector<CachedGraph> graphs_;
};

}  // namespace kiln::cuda
