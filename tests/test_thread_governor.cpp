// The thread governor (circuit/exec/thread_governor.hpp) on synthetic run times: it keeps every
// thread while they pay, moves to fewer when other work makes a smaller team faster, comes back
// once the machine is free, probes rarely on a steady machine. A Program's results depend on its
// team size (Eigen's GEMM blocks by it), so deterministic plans keep the size fixed.
#include <gtest/gtest.h>

#include <functional>

#include <kiln/circuit/exec/executor.hpp>
#include <kiln/circuit/exec/thread_governor.hpp>
#include <kiln/circuit/ir/error.hpp>
#include <kiln/core/engine.hpp>

#include "device_test_util.hpp"

namespace kiln {
namespace {

// Runs `runs` steps whose time is ms_at(team size); returns how many ran at each size.
std::vector<int> drive(ThreadGovernor& g, int runs, const std::function<double(int)>& ms_at) {
  std::vector<int> at(9, 0);
  for (int i = 0; i < runs; ++i) {
    const int t = g.threads();
    ++at[static_cast<size_t>(t)];
    g.record(ms_at(t));
  }
  return at;
}

TEST(ThreadGovernor, KeepsEveryThreadOnAnIdleMachineAndProbesRarely) {
  ThreadGovernor g(2);
  // Idle: 2 threads at 40 ms, 1 thread at 70 ms.
  std::vector<int> at = drive(g, 1000, [](int t) { return t == 2 ? 40.0 : 70.0; });
  EXPECT_EQ(g.threads(), 2);
  EXPECT_LT(at[1], 1000 / 50);  // under 2% of the runs spent probing one thread
}

TEST(ThreadGovernor, MovesToFewerThreadsWhenOtherWorkHoldsACoreAndBack) {
  ThreadGovernor g(2);
  drive(g, 100, [](int t) { return t == 2 ? 40.0 : 70.0; });
  ASSERT_EQ(g.threads(), 2);
  // A busy core: a team of 2 waits at every barrier (170 ms); 1 thread runs at 72 ms.
  drive(g, 40, [](int t) { return t == 2 ? 170.0 : 72.0; });
  EXPECT_EQ(g.threads(), 1);
  // The other work ends: within a few hundred runs the team grows again.
  std::vector<int> at = drive(g, 600, [](int t) { return t == 2 ? 40.0 : 70.0; });
  EXPECT_EQ(g.threads(), 2);
  EXPECT_GT(at[2], 300);
}

TEST(ThreadGovernor, HalvesAndDoublesWithinItsMaximum) {
  ThreadGovernor g(8);
  EXPECT_EQ(g.threads(), 8);
  // Four of eight cores busy: 4 threads are best.
  drive(g, 200, [](int t) { return t == 8 ? 200.0 : t == 4 ? 50.0 : t == 2 ? 90.0 : 170.0; });
  EXPECT_EQ(g.threads(), 4);
}

TEST(ThreadGovernor, AFixedCountIsValidated) {
  EXPECT_THROW(set_num_threads(-1), Error);
  const int was = fixed_num_threads();
  set_num_threads(3);
  EXPECT_EQ(fixed_num_threads(), 3);
  set_num_threads(was);
}

TEST(ThreadGovernor, DeterministicPlansKeepTheirTeamSize) {
  Engine& engine = Engine::current();
  auto adaptive_plan = [&](bool deterministic) {
    engine.set_deterministic(deterministic);
    Tensor x = Tensor::from_vector({1, 2, 3, 4}, Shape{2, 2});
    (x * Tensor::scalar(deterministic ? 3.0 : 5.0)).to_host();
    engine.set_deterministic(false);
    return engine.last_plan()->program->adaptive_threads();
  };
  EXPECT_TRUE(adaptive_plan(false));
  EXPECT_FALSE(adaptive_plan(true));
}

}  // namespace
}  // namespace kiln
