// Program: verification, liveness and the run loop of the Eigen executor.
#include "circuit/executor.hpp"

#include <xmmintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "circuit/error.hpp"

namespace kiln {

namespace {
// KILN_PROFILE=1: time spent in each Prim's reference (op-name + params description), printed
// to stderr at exit. For finding the hot ops of the CPU path; off by default (no clock reads).
struct Profile {
  bool on = std::getenv("KILN_PROFILE") != nullptr;
  std::map<std::string, std::pair<double, int64_t>> ms_calls;
  ~Profile() {
    if (!on || ms_calls.empty()) return;
    double total = 0;
    for (const auto& [k, v] : ms_calls) total += v.first;
    std::fprintf(stderr, "KILN_PROFILE: %.1f ms in Prim references\n", total);
    std::multimap<double, std::string, std::greater<>> by_time;
    for (const auto& [k, v] : ms_calls) by_time.emplace(v.first, k);
    int shown = 0;
    for (const auto& [ms, k] : by_time) {
      if (shown++ == 25) break;
      std::fprintf(stderr, "  %9.1f ms %5.1f%% %8lld calls  %s\n", ms, 100 * ms / total,
                   static_cast<long long>(ms_calls[k].second), k.c_str());
    }
  }
};
Profile& profile() {
  static Profile p;
  return p;
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
}  // namespace

Program::Program(Circuit circuit, std::vector<ValueId> outputs)
    : circuit_(std::move(circuit)), outputs_(std::move(outputs)) {
  circuit_.verify();
  const auto& ops = circuit_.ops();
  for (ValueId o : outputs_)
    if (o < 0 || static_cast<size_t>(o) >= circuit_.num_values())
      throw Error("executor: requested output %" + std::to_string(o) + " does not exist (the circuit has " +
                  std::to_string(circuit_.num_values()) + " values)");
  std::vector<int32_t> last_use(circuit_.num_values(), -1);
  for (size_t i = 0; i < ops.size(); ++i)
    for (ValueId in : ops[i].inputs) last_use[static_cast<size_t>(in)] = static_cast<int32_t>(i);
  for (ValueId o : outputs_) last_use[static_cast<size_t>(o)] = static_cast<int32_t>(ops.size());
  free_after_.resize(ops.size());
  for (size_t v = 0; v < circuit_.num_values(); ++v) {
    const Value& val = circuit_.value(static_cast<ValueId>(v));
    if (val.role != ValueRole::Computed) continue;
    int32_t at = last_use[v] < 0 ? val.producer : last_use[v];
    if (at < static_cast<int32_t>(ops.size())) free_after_[static_cast<size_t>(at)].push_back(static_cast<ValueId>(v));
  }
}

std::vector<HostTensor> Program::run(const std::vector<HostTensor>& bindings) const {
  flush_subnormals_once();
  check_bindings(circuit_, bindings, "executor");
  const auto& ext = circuit_.externals();
  std::vector<HostTensor> values(circuit_.num_values());
  for (size_t i = 0; i < ext.size(); ++i) values[static_cast<size_t>(ext[i])] = bindings[i];
  const auto& ops = circuit_.ops();
  std::vector<std::pair<ValueId, HostTensor>> commits;  // (persistent external, new contents)
  std::vector<const HostTensor*> in;
  std::vector<ValueInfo> out_info;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    in.clear();
    out_info.clear();
    for (ValueId v : op.inputs) in.push_back(&values[static_cast<size_t>(v)]);
    for (ValueId v : op.outputs) out_info.push_back(circuit_.info(v));
    std::vector<HostTensor> out;
    const bool timed = profile().on;
    auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    try {
      out = op.prim->eval(op, in, out_info);
      if (timed) {
        std::string key = op.prim->name + " " + (op.prim->describe ? op.prim->describe(op.params) : "") + " -> " +
                          circuit_.info(op.outputs[0]).shape.str();
        auto& e = profile().ms_calls[key];
        e.first += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ++e.second;
      }
    } catch (const Error& e) {
      std::string msg = e.what();
      if (!op.scope.empty() && msg.find(" in layer ") == std::string::npos) msg += " (in layer '" + op.scope + "')";
      throw Error(msg);
    }
    for (size_t k = 0; k < op.outputs.size(); ++k) values[static_cast<size_t>(op.outputs[k])] = std::move(out[k]);
    if (op.prim->side_effect)
      commits.emplace_back(circuit_.assign_root(op.inputs[0]), values[static_cast<size_t>(op.outputs[0])]);
    for (ValueId dead : free_after_[i]) values[static_cast<size_t>(dead)] = HostTensor();
  }
  for (const auto& [buffer, contents] : commits) {
    const HostTensor& dst = values[static_cast<size_t>(buffer)];
    if (dst.raw() != contents.raw()) std::memcpy(dst.raw(), contents.raw(), dst.nbytes());
  }
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
