// overlap_collectives (see the header): the bucket groups found, then the ops emitted in their
// order with each group as early as it can run and each finish as late as it may.
#include <algorithm>

#include <kiln/circuit/passes/contract.hpp>
#include <kiln/circuit/passes/overlap_collectives.hpp>
#include <kiln/circuit/prims/prim_params.hpp>

namespace kiln {
namespace {

// An all_reduce op and the ops that make its bucket (ascending, the all_reduce last).
struct Bucket {
  std::vector<int32_t> members;
};

bool makes_buckets(const Op& op) { return op.is(PrimId::reshape) || op.is(PrimId::concat); }

std::vector<Bucket> find_buckets(const Circuit& c, const std::vector<ValueId>& outputs, std::vector<int>& bucket_of) {
  const auto& ops = c.ops();
  const std::vector<std::vector<int32_t>> readers = value_readers(c);
  std::vector<char> requested(c.num_values(), 0);
  for (ValueId o : outputs) requested[static_cast<size_t>(o)] = 1;
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].is(PrimId::all_reduce) || AllReduceParams::of(ops[i]).stage != AllReduceStage::whole) continue;
    const int id = static_cast<int>(buckets.size());
    Bucket b{{static_cast<int32_t>(i)}};
    bucket_of[i] = id;
    std::vector<ValueId> work = ops[i].inputs;
    while (!work.empty()) {
      const ValueId v = work.back();
      work.pop_back();
      const int32_t p = c.value(v).producer;
      if (p < 0 || bucket_of[static_cast<size_t>(p)] >= 0 || !makes_buckets(ops[static_cast<size_t>(p)])) continue;
      bool only_the_bucket_reads = true;
      for (ValueId out : ops[static_cast<size_t>(p)].outputs) {
        only_the_bucket_reads = only_the_bucket_reads && !requested[static_cast<size_t>(out)];
        for (int32_t reader : readers[static_cast<size_t>(out)])
          only_the_bucket_reads = only_the_bucket_reads && bucket_of[static_cast<size_t>(reader)] == id;
      }
      if (!only_the_bucket_reads) continue;
      bucket_of[static_cast<size_t>(p)] = id;
      b.members.push_back(p);
      work.insert(work.end(), ops[static_cast<size_t>(p)].inputs.begin(), ops[static_cast<size_t>(p)].inputs.end());
    }
    std::sort(b.members.begin(), b.members.end());
    buckets.push_back(std::move(b));
  }
  return buckets;
}

}  // namespace

Circuit overlap_collectives(const Circuit& c, std::vector<ValueId>& outputs, const Target& target) {
  if (target.gpu()) return c;
  const auto& ops = c.ops();
  std::vector<int> bucket_of(ops.size(), -1);
  const std::vector<Bucket> buckets = find_buckets(c, outputs, bucket_of);
  if (buckets.empty()) return c;

  Rebuild r(c);
  std::vector<char> emitted(ops.size(), 0), waiting(buckets.size(), 1);
  std::vector<ValueId> in_flight(c.num_values(), kNoValue);  // per whole all_reduce's result: its start's
  // Finishes the collectives whose means `op` reads, just before it.
  auto finish_what_reads = [&](const Op& op) {
    for (ValueId v : op.inputs) {
      const ValueId started = in_flight[static_cast<size_t>(v)];
      if (started == kNoValue) continue;
      const Op& whole = ops[static_cast<size_t>(c.value(v).producer)];
      r.map(v, r.emit(whole, AllReduceParams{AllReduceStage::finish}.to_params(), {started})[0]);
      in_flight[static_cast<size_t>(v)] = kNoValue;
    }
  };
  auto ready = [&](size_t id) {
    for (int32_t m : buckets[id].members)
      for (ValueId v : ops[static_cast<size_t>(m)].inputs) {
        const int32_t p = c.value(v).producer;
        if (p >= 0 && bucket_of[static_cast<size_t>(p)] != static_cast<int>(id) && !emitted[static_cast<size_t>(p)])
          return false;
      }
    return true;
  };
  auto start = [&](size_t id) {
    for (int32_t m : buckets[id].members) {
      const Op& op = ops[static_cast<size_t>(m)];
      finish_what_reads(op);
      if (op.is(PrimId::all_reduce))
        in_flight[static_cast<size_t>(op.outputs[0])] =
            r.emit(op, AllReduceParams{AllReduceStage::start}.to_params(), r.at(op.inputs))[0];
      else
        r.copy(op);
      emitted[static_cast<size_t>(m)] = 1;
    }
    waiting[id] = 0;
  };
  auto start_ready_buckets = [&] {
    for (size_t id = 0; id < buckets.size(); ++id)
      if (waiting[id] && ready(id)) start(id);
  };
  start_ready_buckets();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (bucket_of[i] >= 0) continue;
    finish_what_reads(ops[i]);
    r.copy(ops[i]);
    emitted[i] = 1;
    start_ready_buckets();
  }
  for (ValueId o : outputs) {  // a mean the caller reads and no op does
    const ValueId started = in_flight[static_cast<size_t>(o)];
    if (started == kNoValue) continue;
    r.map(o, r.emit(ops[static_cast<size_t>(c.value(o).producer)], AllReduceParams{AllReduceStage::finish}.to_params(),
                    {started})[0]);
    in_flight[static_cast<size_t>(o)] = kNoValue;
  }
  return r.finish(outputs);
}

}  // namespace kiln
