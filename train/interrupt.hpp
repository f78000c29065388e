// Ctrl-C and SIGTERM during training: the first signal only asks the loop to stop after the
// step it is running (and to checkpoint); a second one ends the process at once, as if no
// handler were there.
#pragma once

namespace kiln {

// Installs the handlers for its lifetime and puts back the ones it found.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// The signal asking to stop (SIGINT or SIGTERM), 0 while none came.
int interrupt_signal();

}  // namespace kiln
