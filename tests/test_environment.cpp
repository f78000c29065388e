// What every test of the suite runs under: the executor poisons its buffers before each op
// writes them (circuit/exec/executor.hpp), so that a reference leaving elements unwritten shows.
#include <gtest/gtest.h>

#include <kiln/circuit/exec/executor.hpp>

namespace {

class PoisonedBuffers : public ::testing::Environment {
 public:
  void SetUp() override { kiln::set_poison_buffers(true); }
};

[[maybe_unused]] ::testing::Environment* const poisoned_buffers =
    ::testing::AddGlobalTestEnvironment(new PoisonedBuffers);

}  // namespace
