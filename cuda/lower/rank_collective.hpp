// Which collective between ranks a lowered op asks of the process's device collective
// (cuda/runtime/collective.hpp). The device program adds it to the op's commands; the lowering
// only names it (the collective is the process's, installed at run time).
#pragma once

namespace kiln::cuda {

enum class RankCollective {
  none,
  all_reduce_mean,      // all_reduce: output 0 becomes the mean over the ranks of input 0
  reduce_scatter_mean,  // reduce_scatter {N}: output 0 [S] is this rank's chunk of input 0's [N S] mean
  all_gather,           // all_gather {N}: output 0 [N S] holds every rank's input 0 [S], rank r's at r S
};

}  // namespace kiln::cuda
