// DeviceProgram: lowering of a whole Circuit, buffer liveness (aliases share their root's
// buffer), the launch loop, the index-error status check and the commit of assigned buffers.
#include "cuda/device_program.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cstring>

#include "circuit/error.hpp"
#include "circuit/executor.hpp"
#include "circuit/liveness.hpp"
#include "cuda/lower_util.hpp"

namespace kiln::cuda {

DeviceProgram::DeviceProgram(Circuit circuit, std::vector<ValueId> outputs, Runtime& rt)
    : circuit_(std::move(circuit)), outputs_(std::move(outputs)), rt_(rt) {
  circuit_.verify();
  const auto& ops = circuit_.ops();
  std::vector<int> alias_input;
  for (size_t i = 0; i < ops.size(); ++i) {
    lowered_.push_back(lower(circuit_, static_cast<int>(i)));
    const LoweredOp& l = lowered_.back();
    alias_input.push_back(l.alias_of);
    int slot = -1;
    for (const auto& launch : l.launches)
      for (const auto& a : launch.args)
        if (a.kind == ArgRef::Kind::Status && slot < 0) slot = status_slots_++;
    status_slot_.push_back(slot);
    std::vector<LoadedKernel> loaded;
    for (const auto& launch : l.launches) loaded.push_back(rt_.load(*launch.kernel));
    loaded_.push_back(std::move(loaded));
  }
  Liveness live = buffer_liveness(circuit_, outputs_, alias_input);
  root_ = std::move(live.root);
  free_after_ = std::move(live.free_after);
}

namespace {

// Frees every buffer still held when a run ends, normally or by an exception.
struct Buffers {
  Runtime& rt;
  std::vector<CUdeviceptr> of;  // per value root
  size_t held = 0, peak = 0;
  std::vector<size_t> bytes;
  CUdeviceptr alloc(ValueId v, size_t n) {
    n = std::max<size_t>(n, 4);
    of[static_cast<size_t>(v)] = rt.alloc(n);
    bytes[static_cast<size_t>(v)] = n;
    held += n;
    peak = std::max(peak, held);
    return of[static_cast<size_t>(v)];
  }
  void release(ValueId v) {
    auto& p = of[static_cast<size_t>(v)];
    if (!p) return;
    rt.free(p);
    p = 0;
    held -= bytes[static_cast<size_t>(v)];
  }
  ~Buffers() {
    for (auto& p : of)
      if (p) rt.free(p);
  }
};

size_t nbytes(const ValueInfo& info) { return static_cast<size_t>(info.shape.numel()) * dtype_size(info.dtype); }

}  // namespace

std::vector<HostTensor> DeviceProgram::run(const std::vector<HostTensor>& bindings) {
  check_bindings(circuit_, bindings, "device program");
  const auto& ops = circuit_.ops();
  const auto& ext = circuit_.externals();
  Buffers buf{rt_, std::vector<CUdeviceptr>(circuit_.num_values(), 0), 0, 0,
              std::vector<size_t>(circuit_.num_values())};
  auto ptr = [&](ValueId v) { return buf.of[static_cast<size_t>(root_[static_cast<size_t>(v)])]; };
  for (size_t i = 0; i < ext.size(); ++i) {
    CUdeviceptr d = buf.alloc(ext[i], bindings[i].nbytes());
    if (bindings[i].nbytes()) rt_.upload(d, bindings[i].raw(), bindings[i].nbytes());
  }
  // Status words: two u32 per op that checks indices, zeroed.
  const auto status_value = static_cast<ValueId>(circuit_.num_values());
  buf.of.push_back(0);
  buf.bytes.push_back(0);
  CUdeviceptr status = buf.alloc(status_value, static_cast<size_t>(std::max(status_slots_, 1)) * kStatusWords * 4);
  rt_.memset_zero(status, static_cast<size_t>(std::max(status_slots_, 1)) * kStatusWords * 4);
  int64_t launches = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const LoweredOp& l = lowered_[i];
    if (l.alias_of < 0) {
      for (ValueId o : op.outputs) {
        CUdeviceptr d = buf.alloc(o, nbytes(circuit_.info(o)));
        if (l.zero_outputs) rt_.memset_zero(d, nbytes(circuit_.info(o)));
      }
      // Scratch buffers live in `buf` past the values, so an exception frees them too.
      std::vector<CUdeviceptr> scratch;
      for (size_t s = 0; s < l.scratch_bytes.size(); ++s) {
        buf.of.push_back(0);
        buf.bytes.push_back(0);
        scratch.push_back(buf.alloc(static_cast<ValueId>(buf.of.size() - 1), l.scratch_bytes[s]));
      }
      for (size_t s : l.zeroed_scratch) rt_.memset_zero(scratch[s], l.scratch_bytes[s]);
      try {
        for (size_t k = 0; k < l.launches.size(); ++k) {
          const Launch& launch = l.launches[k];
          if (launch.grid.count() == 0) continue;  // an empty output
          std::vector<uint64_t> args;
          for (const ArgRef& a : launch.args) {
            switch (a.kind) {
              case ArgRef::Kind::Input: args.push_back(ptr(op.inputs[static_cast<size_t>(a.index)])); break;
              case ArgRef::Kind::Output: args.push_back(ptr(op.outputs[static_cast<size_t>(a.index)])); break;
              case ArgRef::Kind::Scratch: args.push_back(scratch[static_cast<size_t>(a.index)]); break;
              case ArgRef::Kind::Status:
                args.push_back(status + static_cast<CUdeviceptr>(status_slot_[i]) * kStatusWords * 4);
                break;
            }
          }
          rt_.launch(loaded_[i][k], launch.grid, launch.block, args);
          ++launches;
        }
      } catch (const Error& e) {
        fail(op.prim->name, op.scope, e.what());
      }
      for (size_t s = 0; s < scratch.size(); ++s) buf.release(static_cast<ValueId>(buf.of.size() - 1 - s));
    }
    for (ValueId dead : free_after_[i]) buf.release(dead);
  }
  rt_.synchronize();
  if (status_slots_ > 0) {
    std::vector<int32_t> words(static_cast<size_t>(status_slots_) * kStatusWords);
    rt_.download(words.data(), status, words.size() * 4);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (status_slot_[i] < 0) continue;
      const int32_t* w = &words[static_cast<size_t>(status_slot_[i]) * kStatusWords];
      if (w[0] != 0)
        fail(ops[i].prim->name, ops[i].scope,
             fmt::format("{} index(es) out of range on the device, e.g. {} (input {})", w[0], w[1],
                         circuit_.info(ops[i].inputs[ops[i].prim->name == "gather_rows" ? 1 : 0]).shape.str()));
    }
  }
  std::vector<HostTensor> results;
  for (ValueId o : outputs_) {
    const ValueInfo& info = circuit_.info(o);
    HostTensor h = HostTensor::zeros(info.dtype, info.shape);
    if (h.nbytes()) rt_.download(h.raw(), ptr(o), h.nbytes());
    results.push_back(std::move(h));
  }
  // The step succeeded: commit assigned persistent buffers into their host bindings. Every
  // download comes first, so a failing one leaves every host buffer as it was.
  std::vector<std::pair<const HostTensor*, HostTensor>> commits;
  for (const Op& op : ops) {
    if (!op.prim->side_effect) continue;
    ValueId target = circuit_.assign_root(op.inputs[0]);
    auto at = std::find(ext.begin(), ext.end(), target);
    const HostTensor& host = bindings[static_cast<size_t>(at - ext.begin())];
    HostTensor contents = HostTensor::zeros(host.dtype(), host.shape());
    if (host.nbytes()) rt_.download(contents.raw(), ptr(op.outputs[0]), host.nbytes());
    commits.emplace_back(&host, std::move(contents));
  }
  for (const auto& [host, contents] : commits)
    if (host->nbytes()) std::memcpy(host->raw(), contents.raw(), host->nbytes());
  last_run_ = {launches, buf.peak};
  return results;
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
