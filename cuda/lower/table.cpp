// Lowering dispatch: the table every family registers into, and the lookups on it.
#include <string>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/kernel_choice.hpp>
#include <kiln/cuda/lower/families.hpp>
#include <kiln/cuda/lower/lower.hpp>
#include <kiln/cuda/lower/util.hpp>

namespace kiln::cuda {

void LoweringTable::set(PrimId prim, Entry e) {
  Entry& slot = entries_[static_cast<size_t>(prim)];
  if (slot.summary) throw Error(std::string("Prim '") + prim_name(prim) + "' has two GPU lowerings");
  slot = e;
}

void LoweringTable::add(PrimId prim, LowerFn fn, const char* summary) { set(prim, Entry{fn, -1, summary}); }

void LoweringTable::add_alias(PrimId prim, int input, const char* summary) {
  set(prim, Entry{nullptr, input, summary});
}

namespace {

// A user Prim reaches lowering only if the plan skipped expand_user_prims, which gives each one a
// kiln Prim or refuses the plan; so this is a bug of the pipeline, and says so.
LoweredOp lower_unexpanded_user_prim(const Circuit&, const Op& op, const Target&) {
  throw Error("user Prim '" + op.prim->name + "' reached the PTX back end unexpanded (expand_user_prims did not run)");
}

// Every Prim has a lowering: a Prim without one would fail only when a plan containing it first
// runs on a GPU, so the table refuses to start instead (a test builds it).
const LoweringTable& table() {
  static const LoweringTable t = [] {
    LoweringTable built;
    register_all_lowerings(built);
    built.add(PrimId::user, lower_unexpanded_user_prim,
              "user Prims: a pointwise body fused like kiln's own, or CPU only (expand_user_prims)");
    for (int i = 0; i < kPrimCount; ++i)
      if (!built.at(static_cast<PrimId>(i)).summary)
        throw Error(std::string("Prim '") + prim_name(static_cast<PrimId>(i)) + "' has no GPU lowering");
    return built;
  }();
  return t;
}

}  // namespace

LoweredOp lower(const Circuit& c, int op_index, const Target& target) {
  const Op& op = c.ops().at(static_cast<size_t>(op_index));
  const LoweringTable::Entry& e = table().at(op.prim->id);
  require_gpu_dtypes(c, op);
  if (!e.fn) {
    LoweredOp r;
    r.alias_of = e.alias_of;
    r.summary = e.summary;
    return r;
  }
  // A kernel with a tuned matmul choice lowers under the Target's policy with its keys applied.
  if (!target.tuned.empty())
    if (const KernelChoice* k = target.tuned.find(kernel_signature(c, op)); k && !k->matmul.empty()) {
      Target tuned = target;
      tuned.matmul = k->matmul_policy(target.matmul);
      LoweredOp r = e.fn(c, op, tuned);
      if (r.summary.empty()) r.summary = e.summary;
      return r;
    }
  LoweredOp r = e.fn(c, op, target);
  if (r.summary.empty()) r.summary = e.summary;
  return r;
}

int alias_input(PrimId prim) { return table().at(prim).alias_of; }

std::string lowering_summary(PrimId prim) { return table().at(prim).summary; }

}  // namespace kiln::cuda
