// Learning-rate schedule: linear warmup to max_lr over `warmup` steps, then cosine decay to
// min_lr at `total` steps (nanoGPT's get_lr). Steps count from 0.
#pragma once

#include <cmath>
#include <cstdint>

namespace kiln {

inline double warmup_cosine_lr(int64_t step, int64_t warmup, int64_t total, double max_lr, double min_lr) {
  if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min_lr;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (max_lr - min_lr);
}

}  // namespace kiln
