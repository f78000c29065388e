// overlap_collectives: data-parallel communication while the backward computes (CPU plans).
#pragma once

#include <vector>

#include <kiln/circuit/ir/circuit.hpp>
#include <kiln/circuit/ir/target.hpp>

namespace kiln {

// Each whole all_reduce op becomes a start and a finish (AllReduceStage). The start, with the
// reshapes and the concat that make its bucket (where nothing else reads them), moves up to
// just after the last op its bucket waits for: the bucket's sum over the ranks begins as soon as
// the backward has produced its gradients. The finish moves down to just before the first op that
// reads the mean (the optimizer's norm or update). Buckets start in the order they become ready,
// the same on every rank (one plan). Values are unchanged: the same sums, in the same buckets.
// GPU plans are returned as they are (the device collective is a node of the step's graph).
Circuit overlap_collectives(const Circuit& c, std::vector<ValueId>& outputs, const Target& target);

}  // namespace kiln
