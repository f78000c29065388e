// Engine: the thread's engine, its device, seed and scopes. What it does is split by
// responsibility: recording (engine_record.cpp), running steps and traces (engine_run.cpp),
// persistent storage (engine_storage.cpp).
#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>
#include <kiln/core/engine.hpp>

namespace kiln {

Engine& Engine::current() {
  thread_local Engine engine;
  return engine;
}

Engine::Engine() {
  rec_.epoch = next_epoch_++;
  static const bool logging_configured = [] {
    spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug shows plan builds
    for (const std::string& w : removed_variable_warnings()) spdlog::warn("{}", w);
    return true;
  }();
  (void)logging_configured;
}

void Engine::set_device(Device d, cuda::Runtime* runtime) {
  realize();  // pending work runs where it was recorded for
  cuda::Runtime* rt = nullptr;
  if (d == Device::CUDA) {
    std::string why;
    rt = runtime ? runtime : cuda_runtime(&why);
    if (!rt) throw Error("device cuda: no usable GPU (" + why + ")");
  }
  if (resident_ && &resident_->runtime() != rt) {
    // Leaving this runtime: every tensor the device updated comes home first.
    for (int32_t slot : resident_->stale_keys()) resident_->sync_host(slot, arenas_.view(slot));
    resident_.reset();
  }
  if (rt && !resident_) resident_ = std::make_unique<cuda::ResidentBuffers>(*rt);
  runtime_ = rt;
  device_ = d;
  target_ = with_device_of(target_, rt ? cuda::device_target(*rt) : cpu_target());
}

void Engine::manual_seed(uint64_t seed) {
  seed_ = seed;
  random_counter_ = 0;
}

void Engine::push_scope(const std::string& name, bool absolute) {
  scopes_.push_back(scope_path_);
  scope_path_ = absolute || scope_path_.empty() ? name : scope_path_ + "." + name;
}

void Engine::pop_scope() {
  scope_path_ = scopes_.back();
  scopes_.pop_back();
}

void manual_seed(uint64_t seed) { Engine::current().manual_seed(seed); }

}  // namespace kiln
