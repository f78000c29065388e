// InterruptGuard (see interrupt.hpp).
#include <signal.h>

#include <atomic>

#include <kiln/train/interrupt.hpp>

namespace kiln {

namespace {

std::atomic<int> requested{0};
struct sigaction saved_int, saved_term;

extern "C" void on_signal(int sig) {
  if (requested.exchange(sig) != 0) {  // the second signal: at once
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

InterruptGuard::InterruptGuard() {
  requested = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &saved_int);
  sigaction(SIGTERM, &sa, &saved_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &saved_int, nullptr);
  sigaction(SIGTERM, &saved_term, nullptr);
  requested = 0;
}

int interrupt_signal() { return requested.load(); }

}  // namespace kiln
