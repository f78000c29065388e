// A live progress line on a terminal: one line rewritten in place (carriage return, erase to the
// end), at most ten times a second. Off when standard output is not a terminal (a log file or a
// pipe gets the trainer's periodic log lines only, never a flood of updates). Lines logged
// meanwhile go through clear() first, so that they never land in the middle of it.
#pragma once

#include <chrono>
#include <string>

namespace kiln {

class ProgressLine {
 public:
  // enabled: draw at all (the trainer passes whether stdout is a terminal).
  explicit ProgressLine(bool enabled);
  ~ProgressLine();
  bool enabled() const { return enabled_; }
  // Shows `text` unless the last update was under 100 ms ago (force: show it anyway).
  void update(const std::string& text, bool force = false);
  // Erases the line, if one is shown.
  void clear();

  // Whether standard output is a terminal.
  static bool stdout_is_terminal();

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace kiln
