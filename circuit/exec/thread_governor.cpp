// ThreadGovernor (see thread_governor.hpp).
#include <algorithm>
#include <cstdlib>
#include <string>

#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/settings.hpp>

namespace kiln {

namespace {
int& fixed_threads() {
  static int n = settings().num_threads;
  return n;
}
}  // namespace

void set_num_threads(int n) {
  if (n < 0 || n > 4096)
    throw Error("set_num_threads: expected 0 (choose) or a thread count up to 4096, received " + std::to_string(n));
  fixed_threads() = n;
}

int fixed_num_threads() { return fixed_threads(); }

ThreadGovernor::ThreadGovernor(int max_threads) : max_(std::max(1, max_threads)), current_(max_) {}

double ThreadGovernor::median(std::deque<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

void ThreadGovernor::start_probe() {
  const bool can_go_down = current_ > 1, can_go_up = current_ < max_;
  if (!can_go_down && !can_go_up) return;
  const bool down = can_go_down && (probe_down_next_ || !can_go_up);
  probe_down_next_ = !down;
  probe_threads_ = down ? std::max(1, current_ / 2) : std::min(max_, current_ * 2);
  probing_ = true;
  probe_.clear();
}

void ThreadGovernor::record(double ms) {
  if (probing_) {
    probe_.push_back(ms);
    if (static_cast<int>(probe_.size()) < kProbeRuns) return;
    probing_ = false;
    if (median(probe_) < 0.9 * median(recent_)) {  // clearly faster: switch
      current_ = probe_threads_;
      recent_ = probe_;
      interval_ = kFirstInterval;
    } else {
      interval_ = std::min(kLongestInterval, 2 * interval_);
    }
    until_probe_ = interval_;
    return;
  }
  // A run far slower than the recent ones: the machine's load may have changed. The window
  // starts again from this run and a probe follows once it is full.
  if (static_cast<int>(recent_.size()) == kWindow && ms > 1.5 * median(recent_)) {
    recent_.clear();
    interval_ = kFirstInterval;
    until_probe_ = 0;
  }
  recent_.push_back(ms);
  if (static_cast<int>(recent_.size()) > kWindow) recent_.pop_front();
  if (--until_probe_ <= 0 && static_cast<int>(recent_.size()) == kWindow) start_probe();
}

}  // namespace kiln
