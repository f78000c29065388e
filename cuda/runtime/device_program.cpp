// DeviceProgram: lowering of a whole Circuit, buffer liveness (aliases share their root's
// buffer), the launch loop, the index-error status check and the commit of assigned buffers.
#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/exec/liveness.hpp>
#include <kiln/circuit/exec/memory_plan.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/cuda/lower/util.hpp>
#include <kiln/cuda/runtime/collective.hpp>
#include <kiln/cuda/runtime/device_program.hpp>

namespace kiln::cuda {

namespace {

size_t status_bytes(int slots) { return static_cast<size_t>(std::max(slots, 1)) * kStatusWords * 4; }

// Frees every buffer still held when a run ends, normally or by an exception. A borrowed
// buffer (the workspace's, or a resident tensor's copy or spare) is only referred to.
struct Buffers {
  Runtime& rt;
  std::vector<CUdeviceptr> of;  // per value root
  std::vector<size_t> bytes;
  std::vector<char> borrowed;
  size_t held = 0, peak = 0;
  Buffers(Runtime& r, size_t values) : rt(r), of(values, 0), bytes(values, 0), borrowed(values, 0) {}
  ValueId add_slot() {
    of.push_back(0);
    bytes.push_back(0);
    borrowed.push_back(0);
    return static_cast<ValueId>(of.size() - 1);
  }
  CUdeviceptr alloc(ValueId v, size_t n) {
    n = std::max<size_t>(n, 4);
    of[static_cast<size_t>(v)] = rt.alloc(n);
    bytes[static_cast<size_t>(v)] = n;
    held += n;
    peak = std::max(peak, held);
    return of[static_cast<size_t>(v)];
  }
  void borrow(ValueId v, CUdeviceptr p) {
    of[static_cast<size_t>(v)] = p;
    borrowed[static_cast<size_t>(v)] = 1;
  }
  void release(ValueId v) {
    auto i = static_cast<size_t>(v);
    if (!of[i]) return;
    if (!borrowed[i]) {
      rt.free(of[i]);
      held -= bytes[i];
    }
    of[i] = 0;
  }
  ~Buffers() {
    for (size_t i = 0; i < of.size(); ++i)
      if (of[i] && !borrowed[i]) rt.free(of[i]);
  }
};

bool same_work(const DeviceCommand& a, const DeviceCommand& b) {
  return a.kernel == b.kernel && a.collective == b.collective && a.rank_collective == b.rank_collective &&
         a.generation == b.generation && a.src == b.src &&
         a.dst == b.dst && a.bytes == b.bytes && a.grid.x == b.grid.x && a.grid.y == b.grid.y && a.grid.z == b.grid.z &&
         a.block.x == b.block.x && a.block.y == b.block.y && a.block.z == b.block.z && a.args == b.args;
}

}  // namespace

DeviceProgram::DeviceProgram(Circuit circuit, std::vector<ValueId> outputs, Runtime& rt)
    : DeviceProgram(std::move(circuit), std::move(outputs), rt, device_target(rt)) {}

DeviceProgram::DeviceProgram(Circuit circuit, std::vector<ValueId> outputs, Runtime& rt, const Target& target)
    : circuit_(std::move(circuit)), outputs_(std::move(outputs)), rt_(rt), target_(target) {
  circuit_.verify();
  const auto& ops = circuit_.ops();
  std::vector<int> alias_input;
  for (size_t i = 0; i < ops.size(); ++i) {
    lowered_.push_back(lower(circuit_, static_cast<int>(i), target_));
    const LoweredOp& l = lowered_.back();
    alias_input.push_back(l.alias_of);
    int slot = -1;
    for (const auto& launch : l.launches)
      for (const auto& a : launch.args)
        if (a.kind == ArgRef::Kind::Status && slot < 0) slot = status_slots_++;
    status_slot_.push_back(slot);
    for (const auto& launch : l.launches)
      for (const auto& a : launch.args)
        if (a.kind == ArgRef::Kind::TensorMap) tensor_maps_.resize(tensor_maps_.size() + 2);  // two entries a map
    std::vector<LoadedKernel> loaded;
    for (const auto& launch : l.launches) loaded.push_back(rt_.load(*launch.kernel));
    loaded_.push_back(std::move(loaded));
  }
  Liveness live = buffer_liveness(circuit_, outputs_, alias_input);
  root_ = std::move(live.root);
  free_after_ = std::move(live.free_after);
  const auto& ext = circuit_.externals();
  assign_target_.assign(ops.size(), -1);
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].prim->side_effect)
      assign_target_[i] =
          static_cast<int>(std::find(ext.begin(), ext.end(), circuit_.assign_root(ops[i].inputs[0])) - ext.begin());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].is(PrimId::reduce_scatter) || ops[i].is(PrimId::all_gather)) {
      const int64_t planned = ops[i].params.ints.size() == 1 ? ops[i].params.ints[0] : 0;
      if (planned != world().size())
        fail(ops[i].prim->name, ops[i].scope,
             fmt::format("planned for {} ranks, the run has {}", planned, world().size()));
    }
    if (lowered_[i].collective != RankCollective::none) {
      has_collectives_ = true;
      require_device_collective(static_cast<int>(i));
    }
  }
  runtime_alive_ = rt_.lifetime();
  static_memory_ = !rt_.exact_block_sizes();
  plan_workspace();
  use_graphs_ = static_memory_ && rt_.graphs_supported() && target_.cuda_graphs;
  if (!tensor_maps_.empty()) tensor_maps_at_ = rt_.alloc(tensor_maps_.size() * sizeof(CUtensorMap));
  tensor_map_over_.assign(tensor_maps_.size(), 0);
  tensor_map_last_.assign(tensor_maps_.size() / 2, 0);
}

DeviceProgram::~DeviceProgram() {
  if (runtime_alive_.expired()) return;  // its memory and graphs went with the runtime
  try {
    for (CachedGraph& g : graphs_) rt_.destroy(g.graph);
    rt_.free(workspace_);
    if (tensor_maps_at_) rt_.free(tensor_maps_at_);
  } catch (...) {  // a destructor frees what it can
  }
}

void DeviceProgram::plan_workspace() {
  const auto& ops = circuit_.ops();
  const int end = static_cast<int>(ops.size());
  planned_offset_.assign(circuit_.num_values(), kUnplanned);
  scratch_offset_.assign(ops.size(), {});
  if (!static_memory_) return;
  // A value assigned to a persistent tensor leaves the run as the tensor's new device copy.
  std::vector<char> escapes(circuit_.num_values(), 0);
  for (size_t i = 0; i < ops.size(); ++i)
    if (assign_target_[i] >= 0 &&
        circuit_.value(circuit_.externals()[static_cast<size_t>(assign_target_[i])]).role == ValueRole::Persistent)
      escapes[static_cast<size_t>(root_[static_cast<size_t>(ops[i].outputs[0])])] = 1;
  std::vector<int> last(circuit_.num_values(), end);  // never freed: to the end of the run
  for (size_t j = 0; j < free_after_.size(); ++j)
    for (ValueId v : free_after_[j]) last[static_cast<size_t>(v)] = static_cast<int>(j);
  std::vector<PlannedBlock> blocks;
  std::vector<size_t*> offset_of;  // per block: where its offset goes
  auto add = [&](int first, int last_step, size_t bytes, size_t* offset) {
    blocks.push_back({first, last_step, std::max<size_t>(bytes, 4)});
    offset_of.push_back(offset);
  };
  // The inputs: one block, each at a 16-byte aligned place in it (offsets relative to the block
  // until the block is placed).
  std::vector<ValueId> inputs;
  size_t inputs_bytes = 0;
  for (ValueId e : circuit_.externals()) {
    if (circuit_.value(e).role == ValueRole::Persistent || escapes[static_cast<size_t>(e)]) continue;
    inputs.push_back(e);
    planned_offset_[static_cast<size_t>(e)] = inputs_bytes;
    inputs_bytes += (circuit_.info(e).nbytes() + 15) / 16 * 16;
  }
  if (!inputs.empty()) add(0, end, inputs_bytes, &inputs_offset_);
  staging_.assign((inputs_bytes + 7) / 8, 0);
  add(0, end, status_bytes(status_slots_), &status_offset_);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (lowered_[i].alias_of >= 0) continue;
    const int step = static_cast<int>(i);
    for (ValueId o : ops[i].outputs)
      if (!escapes[static_cast<size_t>(o)])
        add(step, last[static_cast<size_t>(o)], circuit_.info(o).nbytes(), &planned_offset_[static_cast<size_t>(o)]);
    scratch_offset_[i].resize(lowered_[i].scratch_bytes.size());
    for (size_t k = 0; k < scratch_offset_[i].size(); ++k)
      add(step, step, lowered_[i].scratch_bytes[k], &scratch_offset_[i][k]);
  }
  MemoryPlan plan = plan_memory(blocks);
  for (size_t b = 0; b < blocks.size(); ++b) *offset_of[b] = plan.offset[b];
  for (ValueId e : inputs) planned_offset_[static_cast<size_t>(e)] += inputs_offset_;
  workspace_bytes_ = plan.size;
  peak_live_bytes_ = kiln::peak_live_bytes(blocks);
}

// One run's state, shared by the phases of run(): its bindings and residency, every buffer it
// holds (freed when the run ends, normally or by an exception), the assigned resident tensors'
// spares, and the command list with the status words' address and the tensor maps it takes.
struct DeviceProgram::RunState {
  const std::vector<HostTensor>& bindings;
  const Residency& residency;
  const std::vector<ValueId>& root;  // the program's root_
  const bool resident;
  Buffers buf;
  std::vector<CUdeviceptr> into_spare;              // root -> the spare it is computed into
  std::vector<std::pair<int32_t, ValueId>> copies;  // key, the root copied into its spare
  std::vector<int32_t> assigned;                    // keys flipped after the step
  CUdeviceptr status = 0;                           // the status words
  std::vector<DeviceCommand> commands;
  size_t maps = 0;  // tensor maps encoded so far
  RunState(const std::vector<HostTensor>& b, const Residency& r, const std::vector<ValueId>& roots, Runtime& rt,
           size_t values)
      : bindings(b), residency(r), root(roots), resident(r.buffers != nullptr), buf(rt, values) {}
  // External `external`'s resident key, or -1 (uploaded from its binding).
  int32_t key_of(size_t external) const { return resident ? residency.keys[external] : -1; }
  // The buffer of value v (its root's).
  CUdeviceptr ptr(ValueId v) const { return buf.of[static_cast<size_t>(root[static_cast<size_t>(v)])]; }
  // Appends a command that sets `bytes` at dst to zero, tagged with op (-1: none).
  void zero(int op, CUdeviceptr dst, size_t bytes) {
    DeviceCommand c;
    c.tag = op;
    c.dst = dst;
    c.bytes = bytes;
    commands.push_back(std::move(c));
  }
};

std::vector<HostTensor> DeviceProgram::run(const std::vector<HostTensor>& bindings, const Residency& residency) {
  check_bindings(circuit_, bindings, "device program");
  const auto& ext = circuit_.externals();
  const bool resident = residency.buffers != nullptr;
  if (resident) {
    if (&residency.buffers->runtime() != &rt_) throw Error("device program: resident buffers of another runtime");
    if (residency.keys.size() != ext.size())
      throw Error("device program: " + std::to_string(residency.keys.size()) + " resident keys for " +
                  std::to_string(ext.size()) + " externals");
  }
  const RuntimeStats before = rt_.stats();
  if (static_memory_ && !workspace_) workspace_ = rt_.alloc(workspace_bytes_);
  RunState st(bindings, residency, root_, rt_, circuit_.num_values());
  for (size_t i = 0; i < ext.size(); ++i)
    if (st.key_of(i) >= 0) st.buf.borrow(ext[i], residency.buffers->on_device(st.key_of(i), bindings[i]));
  choose_spares(st);
  upload_inputs(st);
  build_commands(st);
  if (st.maps > 0 && !tensor_maps_current_) {
    rt_.upload(tensor_maps_at_, tensor_maps_.data(), 2 * st.maps * sizeof(CUtensorMap));
    tensor_maps_current_ = true;
  }
  const auto started = std::chrono::steady_clock::now();
  const int64_t launches = execute(st.commands);
  if (has_collectives_ && device_world())
    device_world()->synchronize(rt_);  // NCCL: waits at most its timeout (a rank that died or hangs)
  else
    rt_.synchronize();
  last_run_.device_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (status_slots_ > 0) check_status(st.status);
  std::vector<HostTensor> results;
  for (ValueId o : outputs_) {
    const ValueInfo& info = circuit_.info(o);
    HostTensor h = HostTensor::zeros(info.dtype, info.shape);
    if (h.nbytes()) rt_.download(h.raw(), st.ptr(o), h.nbytes());
    results.push_back(std::move(h));
  }
  commit(st);
  last_run_.launches = launches;
  last_run_.peak_bytes = workspace_bytes_ + st.buf.peak;
  last_run_.uploaded_bytes = rt_.stats().bytes_uploaded - before.bytes_uploaded;
  last_run_.downloaded_bytes = rt_.stats().bytes_downloaded - before.bytes_downloaded;
  last_run_.uploads = rt_.stats().uploads - before.uploads;
  last_run_.downloads = rt_.stats().downloads - before.downloads;
  return results;
}

void DeviceProgram::choose_spares(RunState& st) const {
  // Assigned resident tensors: the step writes each one's spare buffer (flipped in once it has
  // succeeded). The last assign of a tensor counts; a computed value not yet placed there is
  // computed into it, any other (an external, or a value two tensors take) is copied at the end.
  const auto& ops = circuit_.ops();
  st.into_spare.assign(circuit_.num_values(), 0);
  for (size_t i = ops.size(); i-- > 0;) {
    if (assign_target_[i] < 0) continue;
    const int32_t key = st.key_of(static_cast<size_t>(assign_target_[i]));
    if (key < 0 || std::find(st.assigned.begin(), st.assigned.end(), key) != st.assigned.end()) continue;
    st.assigned.push_back(key);
    const auto root = static_cast<size_t>(root_[static_cast<size_t>(ops[i].outputs[0])]);
    if (circuit_.value(static_cast<ValueId>(root)).role == ValueRole::Computed && !st.into_spare[root])
      st.into_spare[root] = st.residency.buffers->spare(key);
    else
      st.copies.emplace_back(key, static_cast<ValueId>(root));
  }
}

CUdeviceptr DeviceProgram::place(RunState& st, ValueId v, size_t bytes) const {
  // A value's buffer: the spare it is computed into, its place in the workspace, or its own.
  if (CUdeviceptr spare = st.into_spare[static_cast<size_t>(v)]) {
    st.buf.borrow(v, spare);
    return spare;
  }
  const size_t at = planned_offset_[static_cast<size_t>(v)];
  if (at == kUnplanned) return st.buf.alloc(v, bytes);
  st.buf.borrow(v, workspace_ + at);
  return workspace_ + at;
}

void DeviceProgram::upload_inputs(RunState& st) {
  // Inputs: packed and uploaded in one copy when they lie together in the workspace.
  const auto& ext = circuit_.externals();
  const std::vector<HostTensor>& bindings = st.bindings;
  auto* staged = reinterpret_cast<std::byte*>(staging_.data());
  for (size_t i = 0; i < ext.size(); ++i) {
    if (st.key_of(i) >= 0) continue;
    CUdeviceptr d = place(st, ext[i], bindings[i].nbytes());
    if (!bindings[i].nbytes()) continue;
    const size_t at = planned_offset_[static_cast<size_t>(ext[i])];
    if (at == kUnplanned)
      rt_.upload(d, bindings[i].raw(), bindings[i].nbytes());
    else
      std::memcpy(staged + (at - inputs_offset_), bindings[i].raw(), bindings[i].nbytes());
  }
  if (!staging_.empty()) rt_.upload(workspace_ + inputs_offset_, staged, staging_.size() * 8);
}

void DeviceProgram::build_commands(RunState& st) {
  // Every buffer gets its address first; the work is then one list of commands, run in order.
  // Status words: two u32 per op that checks indices, zeroed.
  st.status =
      static_memory_ ? workspace_ + status_offset_ : st.buf.alloc(st.buf.add_slot(), status_bytes(status_slots_));
  st.zero(-1, st.status, status_bytes(status_slots_));
  for (size_t i = 0; i < circuit_.ops().size(); ++i) {
    if (lowered_[i].alias_of < 0) op_commands(st, i);
    for (ValueId dead : free_after_[i]) st.buf.release(dead);
  }
}

void DeviceProgram::op_commands(RunState& st, size_t i) {
  const Op& op = circuit_.ops()[i];
  const LoweredOp& l = lowered_[i];
  const int tag = static_cast<int>(i);
  for (ValueId o : op.outputs) {
    CUdeviceptr d = place(st, o, circuit_.info(o).nbytes());
    if (l.zero_outputs) st.zero(tag, d, circuit_.info(o).nbytes());
  }
  // Scratch buffers: in the workspace, or in `buf` past the values (an exception frees them
  // too; one released here is reused only by a later command).
  std::vector<CUdeviceptr> scratch;
  std::vector<ValueId> scratch_slots;
  for (size_t s = 0; s < l.scratch_bytes.size(); ++s) {
    if (static_memory_) {
      scratch.push_back(workspace_ + scratch_offset_[i][s]);
      continue;
    }
    scratch_slots.push_back(st.buf.add_slot());
    scratch.push_back(st.buf.alloc(scratch_slots.back(), l.scratch_bytes[s]));
  }
  for (size_t s : l.zeroed_scratch) st.zero(tag, scratch[s], l.scratch_bytes[s]);
  // A collective between ranks: the device collective's, out of place where it can (all_reduce's
  // copy is the op of one process without one, and precedes an in-place one).
  DeviceCollective* collective = l.collective != RankCollective::none ? device_world() : nullptr;
  const bool skip_launches = collective && !collective->in_place();
  for (size_t k = 0; k < l.launches.size() && !skip_launches; ++k) {
    if (l.launches[k].grid.count() == 0) continue;  // an empty output
    st.commands.push_back(launch_command(st, i, k, scratch));
  }
  if (l.collective != RankCollective::none) {
    require_device_collective(tag);
    if (collective) {
      DeviceCommand c;
      c.tag = tag;
      c.collective = collective;
      c.rank_collective = l.collective;
      c.generation = device_world_generation();
      const bool after_copy = l.collective == RankCollective::all_reduce_mean && collective->in_place();
      c.src = after_copy ? st.ptr(op.outputs[0]) : st.ptr(op.inputs[0]);
      c.dst = st.ptr(op.outputs[0]);
      c.bytes = circuit_.info(op.outputs[0]).nbytes();
      st.commands.push_back(std::move(c));
    }
  }
  for (ValueId slot : scratch_slots) st.buf.release(slot);
}

DeviceCommand DeviceProgram::launch_command(RunState& st, size_t i, size_t k, const std::vector<CUdeviceptr>& scratch) {
  const Op& op = circuit_.ops()[i];
  const Launch& launch = lowered_[i].launches[k];
  DeviceCommand c;
  c.tag = static_cast<int>(i);
  c.kernel = &loaded_[i][k];
  c.grid = launch.grid;
  c.block = launch.block;
  for (const ArgRef& a : launch.args) {
    switch (a.kind) {
      case ArgRef::Kind::Input: c.args.push_back(st.ptr(op.inputs[static_cast<size_t>(a.index)])); break;
      case ArgRef::Kind::Output: c.args.push_back(st.ptr(op.outputs[static_cast<size_t>(a.index)])); break;
      case ArgRef::Kind::Scratch: c.args.push_back(scratch[static_cast<size_t>(a.index)]); break;
      case ArgRef::Kind::Status:
        c.args.push_back(st.status + static_cast<CUdeviceptr>(status_slot_[i]) * kStatusWords * 4);
        break;
      case ArgRef::Kind::TensorMap:
        c.args.push_back(tensor_map_arg(st, i, lowered_[i].tensor_maps[static_cast<size_t>(a.index)]));
        break;
    }
  }
  return c;
}

CUdeviceptr DeviceProgram::tensor_map_arg(RunState& st, size_t i, const TensorMapArg& m) {
  const Op& op = circuit_.ops()[i];
  const CUdeviceptr at =
      st.ptr(op.inputs[static_cast<size_t>(m.input)]) + static_cast<CUdeviceptr>(m.offset) * m.element_bytes;
  // The entry encoded over this buffer in an earlier run, else the one not used last.
  const size_t first = 2 * st.maps;
  size_t entry = tensor_map_over_[first] == at ? first : first + 1;
  if (tensor_map_over_[entry] != at) {
    entry = first + 1 - tensor_map_last_[st.maps];
    tensor_maps_current_ = false;
    tensor_map_over_[entry] = 0;  // until encoded
    tensor_maps_[entry] =
        rt_.encode_tensor_map(fmt::format("op {} ({}): input {}'s tensor map", i, op.prim->name, m.input), at,
                              m.element_bytes, m.dims, m.strides, m.box, m.swizzle_128);
    tensor_map_over_[entry] = at;
  }
  tensor_map_last_[st.maps++] = static_cast<uint8_t>(entry - first);
  return tensor_maps_at_ + entry * sizeof(CUtensorMap);
}

void DeviceProgram::check_status(CUdeviceptr status) const {
  const auto& ops = circuit_.ops();
  std::vector<int32_t> words(static_cast<size_t>(status_slots_) * kStatusWords);
  rt_.download(words.data(), status, words.size() * 4);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (status_slot_[i] < 0) continue;
    const int32_t* w = &words[static_cast<size_t>(status_slot_[i]) * kStatusWords];
    const int k = ops[i].prim->index_input;
    if (w[0] != 0)
      fail(ops[i].prim->name, ops[i].scope,
           fmt::format("{} index(es) out of range on the device, e.g. {} (input {})", w[0], w[1],
                       k >= 0 ? circuit_.info(ops[i].inputs[static_cast<size_t>(k)]).shape.str() : "of indices"));
  }
}

void DeviceProgram::commit(RunState& st) const {
  // The step succeeded: commit. Assigned tensors without a device copy are written into their
  // host bindings (every download first, so a failing one leaves every host buffer as it was);
  // resident ones get their copies, then their spares flip in.
  const auto& ops = circuit_.ops();
  std::vector<std::pair<const HostTensor*, HostTensor>> commits;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (assign_target_[i] < 0 || st.key_of(static_cast<size_t>(assign_target_[i])) >= 0) continue;
    const HostTensor& host = st.bindings[static_cast<size_t>(assign_target_[i])];
    HostTensor contents = HostTensor::zeros(host.dtype(), host.shape());
    if (host.nbytes()) rt_.download(contents.raw(), st.ptr(ops[i].outputs[0]), host.nbytes());
    commits.emplace_back(&host, std::move(contents));
  }
  for (const auto& [key, root] : st.copies)
    rt_.copy(st.residency.buffers->spare(key), st.ptr(root), circuit_.info(root).nbytes());
  if (!st.copies.empty()) rt_.synchronize();
  for (int32_t key : st.assigned) st.residency.buffers->flip(key);
  for (const auto& [host, contents] : commits)
    if (host->nbytes()) std::memcpy(host->raw(), contents.raw(), host->nbytes());
}

void DeviceProgram::require_device_collective(int op) const {
  const int ranks = world().size();
  const DeviceCollective* collective = device_world();
  if (ranks == 1 || (collective && collective->size() == ranks)) return;
  const Op& o = circuit_.ops()[static_cast<size_t>(op)];
  fail(o.prim->name, o.scope,
       collective ? fmt::format("the device collective ({}) spans {} ranks, the run {}", collective->backend(),
                                collective->size(), ranks)
                  : fmt::format("averaging over {} ranks on the GPU needs a device collective "
                                "(cuda::set_device_world; `kiln train` installs NCCL or a host-staged one)",
                                ranks));
}

int64_t DeviceProgram::execute(const std::vector<DeviceCommand>& commands) {
  last_run_.graph = last_run_.graph_built = false;
  // A graph holds collectives only where they are captured (NCCL on the real driver), and only
  // after a run without one: a library's first call may set up connections, which capture forbids.
  bool graphs = use_graphs_;
  for (const DeviceCommand& c : commands)
    if (c.collective && !(c.collective->capturable() && rt_.capture_supported() && collectives_warm_)) graphs = false;
  if (graphs) {
    auto same = [&](const CachedGraph& g) {
      return g.commands.size() == commands.size() &&
             std::equal(commands.begin(), commands.end(), g.commands.begin(), same_work);
    };
    auto it = std::find_if(graphs_.begin(), graphs_.end(), same);
    if (it == graphs_.end()) {
      if (graphs_.size() == 2) {
        rt_.destroy(graphs_.front().graph);
        graphs_.erase(graphs_.begin());
      }
      graphs_.push_back({commands, rt_.make_graph(commands)});
      it = graphs_.end() - 1;
      last_run_.graph_built = true;
    }
    rt_.launch(it->graph);
    last_run_.graph = true;
    return it->graph.kernels;
  }
  int64_t launches = 0;
  for (const DeviceCommand& c : commands) {
    try {
      if (c.collective) {
        run_collective(rt_, c, nullptr);
        collectives_warm_ = true;
        continue;
      }
      if (!c.kernel) {
        rt_.memset_zero(c.dst, c.bytes);
        continue;
      }
      rt_.launch(*c.kernel, c.grid, c.block, c.args);
      ++launches;
    } catch (const Error& e) {
      if (c.tag < 0) throw;
      const Op& op = circuit_.ops()[static_cast<size_t>(c.tag)];
      fail(op.prim->name, op.scope, e.what());
    }
  }
  return launches;
}

std::vector<DeviceProgram::KernelInfo> DeviceProgram::kernels() const {
  std::vector<KernelInfo> out;
  for (size_t i = 0; i < lowered_.size(); ++i)
    for (size_t k = 0; k < lowered_[i].launches.size(); ++k)
      out.push_back(
          {static_cast<int>(i), circuit_.ops()[i].prim->name, &lowered_[i].launches[k], loaded_[i][k].registers});
  return out;
}

std::string DeviceProgram::dump() const {
  std::string s = fmt::format("lowered for {} ({} ops):\n", rt_.device_name(), lowered_.size());
  if (static_memory_)
    s += fmt::format("  workspace {} bytes (at most {} live at once)\n", workspace_bytes_, peak_live_bytes_);
  for (size_t i = 0; i < lowered_.size(); ++i) {
    const Op& op = circuit_.ops()[i];
    const LoweredOp& l = lowered_[i];
    s += fmt::format("  op {:4} {:16} {}{}\n", i, op.prim->name,
                     l.alias_of >= 0 ? fmt::format("alias of input {}", l.alias_of) : l.summary,
                     op.scope.empty() ? "" : "   # " + op.scope);
    for (const auto& launch : l.launches)
      s += fmt::format("         {}  {}\n", launch.kernel->name, launch_text(launch));
  }
  return s;
}

}  // namespace kiln::cuda
