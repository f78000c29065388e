// Lowering dispatch: the table every family registers into, and the lookups on it.
#include <mutex>
#include <string>
#include <unordered_map>

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

// User Prims' kernels, by their PrimDef (whose address is fixed for the process).
struct UserLowerings {
  std::mutex mutex;
  std::unordered_map<const PrimDef*, UserLowering> by_prim;
};
UserLowerings& user_lowerings() {
  static UserLowerings u;
  return u;
}

// Throws unless every launch has a kernel and one argument per parameter, each naming a buffer
// of the op.
void check_user_lowering(const Op& op, const LoweredOp& r) {
  auto bad = [&](const std::string& what) {
    fail(op.prim->name, op.scope, "its GPU kernel lowering (registered at " + op.prim->registered_at + ") " + what);
  };
  if (r.launches.empty() || r.alias_of >= 0)
    bad("must return launches (and no alias: a user Prim's output is its own)");
  for (size_t l = 0; l < r.launches.size(); ++l) {
    const Launch& launch = r.launches[l];
    if (!launch.kernel) bad("returned launch " + std::to_string(l) + " without a kernel");
    if (launch.args.size() != launch.kernel->params.size())
      bad("gives launch " + std::to_string(l) + " " + std::to_string(launch.args.size()) + " arguments for the " +
          std::to_string(launch.kernel->params.size()) + " parameters of kernel " + launch.kernel->name);
    for (const ArgRef& a : launch.args) {
      const size_t count = a.kind == ArgRef::Kind::Input     ? op.inputs.size()
                           : a.kind == ArgRef::Kind::Output  ? op.outputs.size()
                           : a.kind == ArgRef::Kind::Scratch ? r.scratch_bytes.size()
                           : a.kind == ArgRef::Kind::Status  ? 1
                                                             : r.tensor_maps.size();
      if (a.index < 0 || static_cast<size_t>(a.index) >= count)
        bad("names buffer " + std::to_string(a.index) + " of " + std::to_string(count) + " of its kind in launch " +
            std::to_string(l));
    }
  }
}

// A user Prim with kernels of its own; any other reaches lowering only if the plan skipped
// expand_user_prims, which gives each one a kiln Prim or refuses the plan: a pipeline bug.
LoweredOp lower_user_prim(const Circuit& c, const Op& op, const Target& target) {
  UserLowering fn;
  {
    std::lock_guard lock(user_lowerings().mutex);
    auto it = user_lowerings().by_prim.find(op.prim);
    if (it != user_lowerings().by_prim.end()) fn = it->second;
  }
  if (!fn)
    throw Error("user Prim '" + op.prim->name +
                "' reached the PTX back end unexpanded (expand_user_prims did not run)");
  LoweredOp r = fn(c, op, target);
  check_user_lowering(op, r);
  if (r.summary.empty()) r.summary = op.prim->name + ": the program's own kernel";
  return r;
}

// Every Prim has a lowering: a Prim without one would fail only when a plan containing it first
// runs on a GPU, so the table refuses to start instead (a test builds it).
const LoweringTable& table() {
  static const LoweringTable t = [] {
    LoweringTable built;
    register_all_lowerings(built);
    built.add(PrimId::user, lower_user_prim,
              "user Prims: a pointwise or row body fused like kiln's own, kernels of their own, or CPU only");
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

void register_user_lowering(const PrimDef& prim, UserLowering lowering) {
  if (prim.id != PrimId::user) throw Error("register_user_lowering: '" + prim.name + "' is kiln's own Prim");
  std::lock_guard lock(user_lowerings().mutex);
  if (!user_lowerings().by_prim.emplace(&prim, std::move(lowering)).second)
    throw Error("register_user_lowering: Prim '" + prim.name + "' has a GPU kernel lowering already");
}

int alias_input(PrimId prim) { return table().at(prim).alias_of; }

std::string lowering_summary(PrimId prim) { return table().at(prim).summary; }

}  // namespace kiln::cuda
