// Program: verification, the static memory plan, constants and the run loop of the Eigen executor.
#include <malloc.h>
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <string>
#include <utility>

#include <kiln/circuit/comm/communicator.hpp>
#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/exec/liveness.hpp>
#include <kiln/circuit/exec/memory_plan.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {

namespace {
// KILN_PROFILE=N: time spent in each Prim's reference (op-name + params description), printed
// to stderr at exit with the N costliest (25 when N is not a number above 0). For finding the
// hot ops of the CPU path; off by default (no clock reads).
struct Profile {
  int shown_max = settings().profile_top;
  bool on = shown_max > 0;
  std::map<std::string, std::pair<double, int64_t>> ms_calls;
  ~Profile() {
    if (!on || ms_calls.empty()) return;
    double total = 0;
    for (const auto& [k, v] : ms_calls) total += v.first;
    std::fprintf(stderr, "KILN_PROFILE: %.1f ms in Prim references\n", total);
    std::map<std::string, double> by_prim;  // the key's first word is the Prim's name
    for (const auto& [k, v] : ms_calls) by_prim[k.substr(0, k.find(' '))] += v.first;
    for (const auto& [prim, ms] : by_prim)
      std::fprintf(stderr, "  %9.1f ms %5.1f%% in %s\n", ms, 100 * ms / total, prim.c_str());
    std::multimap<double, std::string, std::greater<>> by_time;
    for (const auto& [k, v] : ms_calls) by_time.emplace(v.first, k);
    int shown = 0;
    for (const auto& [ms, k] : by_time) {
      if (shown++ == shown_max) break;
      std::fprintf(stderr, "  %9.1f ms %5.1f%% %8lld calls  %s\n", ms, 100 * ms / total,
                   static_cast<long long>(ms_calls[k].second), k.c_str());
    }
  }
};
Profile& profile() {
  static Profile p;
  return p;
}

// The GEMM libraries allocate their packing buffers on each call (oneDNN's sgemm: several
// hundred KiB). glibc serves blocks that large by mmap, or trims them off the heap once freed,
// so every step would fault fresh zeroed pages in again (9 per step with oneDNN, 38 recorded).
// Fixed thresholds keep freed blocks on the heap for reuse, as a training process wants; a
// threshold set in the environment (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) is left alone.
void keep_freed_memory_once() {
  static const bool done = [] {
    const Settings s = settings();
    if (!s.malloc_mmap_threshold_set) mallopt(M_MMAP_THRESHOLD, 64 << 20);
    if (!s.malloc_trim_threshold_set) mallopt(M_TRIM_THRESHOLD, 256 << 20);
    return true;
  }();
  (void)done;
}

// Subnormal floats (tiny attention probabilities and their gradients) make x86 arithmetic
// up to 100x slower: a 64-GEMM attention batch took 16 ms instead of 0.14 ms. Like most
// training frameworks, the CPU path flushes them to zero (FTZ + DAZ), on the calling thread
// and on every OpenMP worker.
void flush_subnormals_once() {
  thread_local bool done = false;
  if (done) return;
  done = true;
  _mm_setcsr(_mm_getcsr() | 0x8040);
  static const bool workers = [] {
#pragma omp parallel
    _mm_setcsr(_mm_getcsr() | 0x8040);
    return true;
  }();
  (void)workers;
}

// A reference writes into the storage it was given, or returns the input its Prim aliases:
// anything else would escape the memory plan (a planned value in storage of its own).
void check_storage(const Op& op, const std::vector<const HostTensor*>& in, const std::vector<HostTensor>& planned,
                   const std::vector<HostTensor>& out) {
  auto fail = [&](const std::string& what) {
    throw Error("executor: op '" + op.prim->name + "' " + what + " (a bug in its Eigen reference)");
  };
  if (out.size() != op.outputs.size())
    fail("returned " + std::to_string(out.size()) + " results for " + std::to_string(op.outputs.size()) + " outputs");
  const int alias = op.prim->output_aliases;
  if (alias >= 0 && out[0].raw() != in[static_cast<size_t>(alias)]->raw() && out[0].numel() > 0)
    fail("must return the storage of input " + std::to_string(alias) + " and returned other storage");
  for (size_t k = alias >= 0 ? 1 : 0; k < out.size(); ++k)
    if (planned[k].defined() && out[k].raw() != planned[k].raw() && out[k].numel() > 0)
      fail("wrote output " + std::to_string(k) + " outside the buffer planned for it");
}

std::atomic<bool> poison_flag{false};
}  // namespace

void set_poison_buffers(bool on) { poison_flag = on; }
bool poison_buffers() { return poison_flag; }

Program::Program(Circuit circuit, std::vector<ValueId> outputs, Target target)
    : circuit_(std::move(circuit)),
      outputs_(std::move(outputs)),
      target_(std::move(target)),
      governor_(omp_get_max_threads()) {
  circuit_.verify();
  const auto& ops = circuit_.ops();
  const size_t n = circuit_.num_values();
  for (ValueId o : outputs_)
    if (o < 0 || static_cast<size_t>(o) >= n)
      throw Error("executor: requested output %" + std::to_string(o) + " does not exist (the circuit has " +
                  std::to_string(n) + " values)");
  // Values that depend on no binding: ops (but assigns) whose inputs are all such values.
  std::vector<char> constant_value(n, 0);
  constant_op_.assign(ops.size(), 0);
  std::vector<int> alias_input(ops.size(), -1);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    alias_input[i] = op.prim->output_aliases;
    bool constant = !op.prim->side_effect;
    for (ValueId in : op.inputs) constant = constant && constant_value[static_cast<size_t>(in)];
    constant_op_[i] = constant;
    for (ValueId out : op.outputs) constant_value[static_cast<size_t>(out)] = constant;
  }
  Liveness live = buffer_liveness(circuit_, outputs_, alias_input);
  root_ = std::move(live.root);
  storage_.assign(n, Storage::Planned);
  in_buffer_.assign(n, kNoValue);
  for (size_t v = 0; v < n; ++v)
    if (circuit_.value(static_cast<ValueId>(v)).role != ValueRole::Computed)
      storage_[v] = Storage::External;
    else if (constant_value[v])
      storage_[v] = Storage::Constant;
  // What the caller keeps gets storage of its own, which the next run does not overwrite.
  for (ValueId o : outputs_) {
    Storage& s = storage_[static_cast<size_t>(root_[static_cast<size_t>(o)])];
    if (s == Storage::Planned) s = Storage::Fresh;
  }
  overwrites_.assign(ops.size(), 0);
  if (target_.cpu_overwrite_inputs) store_updates_in_their_buffers();
  const int end = static_cast<int>(ops.size());
  std::vector<int> last(n, end);  // never freed: to the end of the run (assigned contents)
  for (size_t i = 0; i < live.free_after.size(); ++i)
    for (ValueId v : live.free_after[i]) last[static_cast<size_t>(v)] = static_cast<int>(i);
  std::vector<PlannedBlock> blocks;
  std::vector<int> block_of(n, -1);  // per planned root: its block
  for (size_t i = 0; i < ops.size(); ++i) {
    std::vector<int> taken;  // blocks this op's outputs write over
    for (size_t o = 0; o < ops[i].outputs.size(); ++o) {
      const ValueId out = ops[i].outputs[o];
      const auto v = static_cast<size_t>(out);
      if (root_[v] != out || storage_[v] != Storage::Planned) continue;
      const int over = target_.cpu_overwrite_inputs ? dying_input_to_overwrite(i, o, last, block_of, taken) : -1;
      if (over >= 0) {  // the input's block lives on as this output
        blocks[static_cast<size_t>(over)].last = last[v];
        block_of[v] = over;
        taken.push_back(over);
        overwrites_[i] = 1;
        continue;
      }
      block_of[v] = static_cast<int>(blocks.size());
      blocks.push_back({static_cast<int>(i), last[v], circuit_.info(out).nbytes()});
    }
  }
  // 64-byte offsets: every planned tensor starts on a cache line (and an AVX-512 vector).
  const MemoryPlan plan = plan_memory(blocks, 64);
  offset_.assign(n, 0);
  for (size_t v = 0; v < n; ++v)
    if (block_of[v] >= 0) offset_[v] = plan.offset[static_cast<size_t>(block_of[v])];
  workspace_bytes_ = plan.size;
  peak_live_bytes_ = kiln::peak_live_bytes(blocks);
  op_state_.resize(ops.size());
  if (!target_.tuned.empty())
    for (size_t i = 0; i < ops.size(); ++i)
      if (const KernelChoice* c = target_.tuned.find(kernel_signature(circuit_, ops[i]))) op_state_[i].choice = *c;
}

void Program::store_updates_in_their_buffers() {
  const auto& ops = circuit_.ops();
  const size_t n = circuit_.num_values();
  const int end = static_cast<int>(ops.size());
  // From `safe_from` on, no op fails but through a bug or memory running out: assigns, and
  // references that may write over their inputs (pointwise and row bodies, whose params, dtypes
  // and shapes were checked with the plan). So a run whose error comes before changes no buffer.
  // A collective's finish may still fail (a rank that died), so it ends the safe tail too.
  int safe_from = end;
  auto cannot_fail = [](const Op& op) {
    return (op.prim->side_effect || op.prim->may_overwrite) && !is_collective(op);
  };
  while (safe_from > 0 && cannot_fail(ops[static_cast<size_t>(safe_from - 1)])) --safe_from;
  // Per persistent buffer: how often it is assigned, its new contents, and its old contents'
  // last reader (an assign's target is not a read of it; its result is the new contents).
  std::vector<int> assigns(n, 0), last_read(n, -1);
  std::vector<ValueId> buffer_of(n, kNoValue);  // per value: the buffer it is assigned to
  auto root = [&](ValueId v) { return static_cast<size_t>(root_[static_cast<size_t>(v)]); };
  for (int i = 0; i < end; ++i) {
    const Op& op = ops[static_cast<size_t>(i)];
    for (size_t k = op.prim->side_effect ? 1 : 0; k < op.inputs.size(); ++k)
      last_read[root(op.inputs[k])] = std::max(last_read[root(op.inputs[k])], i);
    if (op.prim->side_effect) {
      const ValueId buffer = circuit_.assign_root(op.inputs[0]);
      ++assigns[static_cast<size_t>(buffer)];
      buffer_of[static_cast<size_t>(op.inputs[1])] = buffer;
      last_read[root(op.outputs[0])] = end;
    }
  }
  for (ValueId o : outputs_) last_read[root(o)] = end;  // a buffer a result views is left to the commit
  std::vector<ValueInfo> inputs;
  for (int i = safe_from; i < end; ++i) {
    const Op& op = ops[static_cast<size_t>(i)];
    if (!op.prim->may_overwrite) continue;
    inputs.clear();
    for (ValueId in : op.inputs) inputs.push_back(circuit_.info(in));
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const auto v = static_cast<size_t>(op.outputs[o]);
      const ValueId buffer = buffer_of[v];
      if (buffer == kNoValue || root_[v] != op.outputs[o] || storage_[v] != Storage::Planned) continue;
      const auto b = static_cast<size_t>(buffer);
      if (assigns[b] != 1 || last_read[b] != i || circuit_.info(buffer) != circuit_.info(op.outputs[o])) continue;
      // The op reads the buffer's old contents (Adam's moment, the weight it updates), and each
      // of its reads of them allows writing the output over them.
      if (!every_read_allows_overwrite(op, inputs, o, b)) continue;
      storage_[v] = Storage::InBuffer;
      in_buffer_[v] = buffer;
      overwrites_[static_cast<size_t>(i)] = 1;
      writes_in_buffers_ = true;
    }
  }
}

void Program::check_in_buffer_bindings(const std::vector<HostTensor>& bindings) const {
  struct Range {
    const std::byte *begin, *end;
    size_t external;
  };
  std::vector<Range> ranges;
  const auto& ext = circuit_.externals();
  for (size_t i = 0; i < bindings.size(); ++i)
    if (bindings[i].nbytes() > 0) {
      const auto* b = static_cast<const std::byte*>(bindings[i].raw());
      ranges.push_back({b, b + bindings[i].nbytes(), i});
    }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  const std::byte* reach = nullptr;  // the furthest end of the ranges before
  size_t reach_external = 0;
  for (size_t j = 0; j < ranges.size(); ++j) {
    const Range& r = ranges[j];
    const bool overlaps_before = reach != nullptr && reach > r.begin;
    const bool overlaps_next = j + 1 < ranges.size() && ranges[j + 1].begin < r.end;
    auto in_buffer = [&](size_t e) {
      return std::find(in_buffer_.begin(), in_buffer_.end(), ext[e]) != in_buffer_.end();
    };
    const size_t other = overlaps_before ? reach_external : overlaps_next ? ranges[j + 1].external : r.external;
    if (other != r.external && (in_buffer(r.external) || in_buffer(other))) {
      auto name = [&](size_t e) {
        const Value& v = circuit_.value(ext[e]);
        return "%" + std::to_string(ext[e]) + (v.name.empty() ? "" : " '" + v.name + "'");
      };
      throw Error("executor: the bindings for " + name(r.external) + " and " + name(other) +
                  " share memory, and the run writes one of them in place (an optimizer's update): bind "
                  "tensors of their own, or plan with Target::cpu_overwrite_inputs off");
    }
    if (reach == nullptr || r.end > reach) {
      reach = r.end;
      reach_external = r.external;
    }
  }
}

int Program::dying_input_to_overwrite(size_t op_index, size_t output, const std::vector<int>& last,
                                      const std::vector<int>& block_of, const std::vector<int>& taken) const {
  const Op& op = circuit_.ops()[op_index];
  if (!op.prim->may_overwrite) return -1;
  const ValueInfo& out = circuit_.info(op.outputs[output]);
  auto root_of = [&](size_t k) { return static_cast<size_t>(root_[static_cast<size_t>(op.inputs[k])]); };
  std::vector<ValueInfo> inputs;
  for (ValueId in : op.inputs) inputs.push_back(circuit_.info(in));
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    const size_t r = root_of(k);
    const int block = block_of[r];
    // Read by nothing after this op, the whole of its buffer, and not yet written over here.
    if (storage_[r] != Storage::Planned || block < 0 || last[r] != static_cast<int>(op_index)) continue;
    if (inputs[k] != out || circuit_.info(static_cast<ValueId>(r)).nbytes() != out.nbytes()) continue;
    if (std::find(taken.begin(), taken.end(), block) != taken.end()) continue;
    if (every_read_allows_overwrite(op, inputs, output, r)) return block;
  }
  return -1;
}

bool Program::every_read_allows_overwrite(const Op& op, const std::vector<ValueInfo>& inputs, size_t output,
                                          size_t root) const {
  const ValueInfo& out = circuit_.info(op.outputs[output]);
  bool reads = false;
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    if (static_cast<size_t>(root_[static_cast<size_t>(op.inputs[k])]) != root) continue;
    reads = true;
    if (inputs[k] != out || !op.prim->may_overwrite(op, inputs, output, k)) return false;
  }
  return reads;
}

int Program::threads() const {
  const int fixed = fixed_num_threads();
  return fixed > 0 ? fixed : adaptive_threads_ ? governor_.threads() : governor_.max_threads();
}

size_t Program::constant_ops() const {
  return static_cast<size_t>(std::count(constant_op_.begin(), constant_op_.end(), 1));
}

void Program::prepare_storage() const {
  workspace_ = HostTensor::zeros(DType::f64, Shape{static_cast<int64_t>((workspace_bytes_ + 7) / 8)});
  auto* base = static_cast<std::byte*>(workspace_.raw());
  planned_.assign(circuit_.num_values(), HostTensor());
  for (size_t v = 0; v < planned_.size(); ++v)
    if (storage_[v] == Storage::Planned && root_[v] == static_cast<ValueId>(v)) {
      const ValueInfo& info = circuit_.info(static_cast<ValueId>(v));
      planned_[v] = HostTensor::view(info.dtype, info.shape, base + offset_[v]);
    }
  constants_.assign(circuit_.num_values(), HostTensor());
}

namespace {

// Copies each persistent buffer's new contents in, once the whole run has succeeded (a failed
// run changes no buffer). Every new content is what the run computed: a buffer assigned twice
// (a gradient two backward passes add to) gets its last, and contents that are another
// assigned buffer's memory (assign(a, b) of buffer b, or a view of it) are b's value during
// the run, so they are staged before b is written. A training step's parameters and optimizer
// moments are megabytes, so the copies are split into pieces the team shares.
void commit(const std::vector<std::pair<ValueId, HostTensor>>& commits, const std::vector<HostTensor>& values) {
  struct Copy {
    std::byte* dst;
    const std::byte* src;
    size_t bytes;
  };
  std::vector<Copy> last;  // per assigned buffer, its last contents (in place or not)
  for (auto it = commits.rbegin(); it != commits.rend(); ++it) {
    const HostTensor& dst = values[static_cast<size_t>(it->first)];
    auto* d = static_cast<std::byte*>(dst.raw());
    if (std::none_of(last.begin(), last.end(), [&](const Copy& c) { return c.dst == d; }))
      last.push_back({d, static_cast<const std::byte*>(it->second.raw()), dst.nbytes()});
  }
  std::vector<std::pair<const std::byte*, const std::byte*>> written;  // by address; buffers do not overlap
  for (const Copy& c : last)
    if (c.src != c.dst) written.emplace_back(c.dst, c.dst + c.bytes);
  std::sort(written.begin(), written.end());
  auto in_written = [&](const Copy& c) {
    const auto after =
        std::upper_bound(written.begin(), written.end(), std::make_pair(c.src + c.bytes, c.src + c.bytes));
    return c.bytes > 0 && after != written.begin() && std::prev(after)->second > c.src;
  };
  std::vector<std::vector<std::byte>> staged;  // only for contents read from an assigned buffer
  for (Copy& c : last)
    if (c.src != c.dst && in_written(c)) {
      staged.emplace_back(c.src, c.src + c.bytes);
      c.src = staged.back().data();
    }
  constexpr size_t kPiece = size_t{1} << 16;  // bytes
  std::vector<Copy> pieces;
  for (const Copy& c : last)
    if (c.src != c.dst)
      for (size_t at = 0; at < c.bytes; at += kPiece)
        pieces.push_back({c.dst + at, c.src + at, std::min(kPiece, c.bytes - at)});
  const auto count = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t i = 0; i < count; ++i) std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
}

}  // namespace

std::vector<HostTensor> Program::run(const std::vector<HostTensor>& bindings) const {
  if (running_.exchange(true))
    throw Error("executor: a Program runs one call at a time (it keeps its workspace between runs)");
  // The run's team size holds for this thread until the run returns.
  struct Release {
    std::atomic<bool>& flag;
    int saved_threads = omp_get_max_threads();
    ~Release() {
      omp_set_num_threads(saved_threads);
      flag = false;
    }
  } release{running_};
  const int team = threads();
  omp_set_num_threads(team);
  const auto started = std::chrono::steady_clock::now();
  flush_subnormals_once();
  keep_freed_memory_once();
  check_bindings(circuit_, bindings, "executor");
  if (writes_in_buffers_) check_in_buffer_bindings(bindings);
  if (planned_.empty()) prepare_storage();
  const auto& ext = circuit_.externals();
  const auto& ops = circuit_.ops();
  std::vector<HostTensor> values(circuit_.num_values());
  for (size_t i = 0; i < ext.size(); ++i) values[static_cast<size_t>(ext[i])] = bindings[i];
  if (constants_ready_)
    for (size_t i = 0; i < ops.size(); ++i)
      if (constant_op_[i])
        for (ValueId out : ops[i].outputs) values[static_cast<size_t>(out)] = constants_[static_cast<size_t>(out)];
  const bool poison = poison_buffers();
  if (record_op_times_) op_ms_.assign(ops.size(), 0.0);
  std::vector<std::pair<ValueId, HostTensor>> commits;  // (persistent external, new contents)
  std::vector<const HostTensor*> in;
  std::vector<ValueInfo> out_info;
  std::vector<HostTensor> planned;
  int collectives_in_flight = 0;  // all_reduce starts not yet finished (overlap_collectives)
  // A run that fails with collectives in flight waits for them before its buffers are reused
  // (their messages still arrive there); if that fails too, the first error is the one reported.
  struct FinishStartedOnFailure {
    const int& in_flight;
    ~FinishStartedOnFailure() {
      if (in_flight > 0 && std::uncaught_exceptions() > 0) try {
          world().finish_all_started();
        } catch (...) {
        }
    }
  } finish_started{collectives_in_flight};
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (constant_op_[i] && constants_ready_) continue;
    // MPI moves a started collective on only inside its calls: one between every two ops.
    if (collectives_in_flight > 0) world().progress();
    if (op.is(PrimId::all_reduce)) {
      const AllReduceStage stage = AllReduceParams::of(op).stage;
      collectives_in_flight += stage == AllReduceStage::start ? 1 : stage == AllReduceStage::finish ? -1 : 0;
    }
    in.clear();
    out_info.clear();
    planned.clear();
    for (ValueId v : op.inputs) in.push_back(&values[static_cast<size_t>(v)]);
    for (ValueId v : op.outputs) {
      out_info.push_back(circuit_.info(v));
      const ValueId buffer = in_buffer_[static_cast<size_t>(v)];
      planned.push_back(buffer == kNoValue ? planned_[static_cast<size_t>(v)] : values[static_cast<size_t>(buffer)]);
    }
    // Poison would write over an input the op writes an output over before it reads it (so
    // nothing of such an op is poisoned, its other outputs and scratch included).
    EvalBuffers bufs(out_info, planned, &op_state_[i], poison && !overwrites_[i], &target_);
    std::vector<HostTensor> out;
    const bool timed = profile().on || record_op_times_;
    auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    // A tuned op may run on fewer threads than the team (a small one pays less to start them).
    const int op_threads = op_state_[i].choice.threads;
    const bool fewer = op_threads > 0 && op_threads < team;
    if (fewer) omp_set_num_threads(op_threads);
    try {
      out = op.prim->eval(op, in, bufs);
      if (fewer) omp_set_num_threads(team);
      if (record_op_times_)
        op_ms_[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (profile().on) {
        std::string key = op.prim->name + " " + (op.prim->describe ? op.prim->describe(op.params) : "") + " -> " +
                          circuit_.info(op.outputs[0]).shape.str();
        auto& e = profile().ms_calls[key];
        e.first += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ++e.second;
      }
    } catch (const Error& e) {  // the team size is restored by `release`
      std::string msg = e.what();
      if (!op.scope.empty() && msg.find(" in layer ") == std::string::npos) msg += " (in layer '" + op.scope + "')";
      throw Error(msg);
    }
    check_storage(op, in, planned, out);
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      const auto v = static_cast<size_t>(op.outputs[k]);
      values[v] = std::move(out[k]);
      if (constant_op_[i]) constants_[v] = values[v];
    }
    if (op.prim->side_effect)
      commits.emplace_back(circuit_.assign_root(op.inputs[0]), values[static_cast<size_t>(op.outputs[0])]);
  }
  constants_ready_ = true;
  if (fixed_num_threads() == 0 && adaptive_threads_)
    governor_.record(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  commit(commits, values);
  std::vector<HostTensor> result;
  for (ValueId o : outputs_) result.push_back(values[static_cast<size_t>(o)]);
  return result;
}

void check_bindings(const Circuit& c, const std::vector<HostTensor>& bindings, const std::string& who) {
  const auto& ext = c.externals();
  if (bindings.size() != ext.size())
    throw Error(who + ": the circuit has " + std::to_string(ext.size()) + " external values, " +
                std::to_string(bindings.size()) + " were bound");
  for (size_t i = 0; i < ext.size(); ++i) {
    const Value& v = c.value(ext[i]);
    const HostTensor& b = bindings[i];
    if (!b.defined() || b.dtype() != v.info.dtype || b.shape() != v.info.shape)
      throw Error(who + ": binding for %" + std::to_string(ext[i]) + (v.name.empty() ? "" : " '" + v.name + "'") +
                  ": expected " + dtype_name(v.info.dtype) + v.info.shape.str() + ", received " +
                  (b.defined() ? std::string(dtype_name(b.dtype())) + b.shape().str() : std::string("nothing")));
  }
}

std::vector<HostTensor> execute(const Circuit& c, const std::vector<HostTensor>& bindings,
                                const std::vector<ValueId>& outputs) {
  return Program(c, outputs).run(bindings);
}

}  // namespace kiln
