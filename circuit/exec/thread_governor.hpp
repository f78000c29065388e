// How many OpenMP threads a Program's runs use. On an idle machine, all the process may use.
// When other work holds cores, a team of N threads waits at each of a step's hundreds of
// barriers for whichever thread is not running (default GPT step, 2 threads on 2 cores with one
// core busy: 172 ms against 71 ms with 1 thread; a passive wait policy does not help, 234 ms),
// so the governor times the runs at its team size and, now and then, a few runs at half or
// twice that, and keeps the faster. A fixed count (kiln::set_num_threads, KILN_NUM_THREADS,
// `--threads`) turns it off.
#pragma once

#include <cstdint>
#include <deque>

namespace kiln {

class ThreadGovernor {
 public:
  explicit ThreadGovernor(int max_threads);

  // The team size for the next run, and the run's time once done.
  int threads() const { return probing_ ? probe_threads_ : current_; }
  int max_threads() const { return max_; }
  void record(double ms);

  // Runs between probes: short after a change or a sudden slowdown, doubling while the team
  // size holds, so that an idle machine pays for probes on under 2% of its runs.
  static constexpr int kFirstInterval = 16, kLongestInterval = 256, kProbeRuns = 3, kWindow = 5;

 private:
  void start_probe();
  static double median(std::deque<double> xs);

  int max_, current_;
  std::deque<double> recent_;  // the last kWindow run times at current_
  std::deque<double> probe_;   // run times of the probe under way
  bool probing_ = false;
  bool probe_down_next_ = true;
  int probe_threads_ = 0;
  int interval_ = kFirstInterval, until_probe_ = kFirstInterval;
};

// A fixed team size for every Program (0: let each Program's governor choose, up to
// omp_get_max_threads()). The environment variable KILN_NUM_THREADS sets it at start-up.
void set_num_threads(int n);
int fixed_num_threads();

}  // namespace kiln
