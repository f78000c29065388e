// ProgressLine: "\r" + text + erase-to-end-of-line on stdout.
#include <unistd.h>

#include <cstdio>

#include <kiln/train/progress_line.hpp>

namespace kiln {

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled) {}

ProgressLine::~ProgressLine() { clear(); }

bool ProgressLine::stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

void ProgressLine::update(const std::string& text, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && shown_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  std::fprintf(stdout, "\r%s\033[K", text.c_str());
  std::fflush(stdout);
  shown_ = true;
}

void ProgressLine::clear() {
  if (!enabled_ || !shown_) return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  shown_ = false;
}

}  // namespace kiln
