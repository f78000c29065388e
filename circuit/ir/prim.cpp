// Prim names, registry lookups, Params equality and hashing, and the error helpers given to shape
// rules. The registry is filled by circuit/prims/registry.cpp.
#include <bit>
#include <cstring>
#include <filesystem>

#include <kiln/circuit/ir/error.hpp>
#include <kiln/circuit/ir/hash.hpp>
#include <kiln/circuit/ir/prim.hpp>

namespace kiln {

bool Params::operator==(const Params& o) const {
  if (ints != o.ints || dtype != o.dtype || reals.size() != o.reals.size()) return false;
  for (size_t i = 0; i < reals.size(); ++i)
    if (std::bit_cast<uint64_t>(reals[i]) != std::bit_cast<uint64_t>(o.reals[i])) return false;
  if (body.is_null() != o.body.is_null() || (body && body != o.body)) return false;
  if (index.is_null() != o.index.is_null() || (index && index != o.index)) return false;
  return bodies == o.bodies;
}

uint64_t Params::hash() const {
  uint64_t h = hash_combine(0x5EEDULL, static_cast<uint64_t>(dtype));
  for (int64_t v : ints) h = hash_combine(h, static_cast<uint64_t>(v));
  h = hash_combine(h, 0xA11);
  for (double v : reals) h = hash_combine(h, std::bit_cast<uint64_t>(v));
  if (body) h = hash_combine(h, body.hash());
  if (index) h = hash_combine(h, index.hash());
  for (const ScalarExp& e : bodies) h = hash_combine(h, e.hash());
  return h;
}

void ShapeCtx::fail(const std::string& message) const { kiln::fail(prim.name, layer, message); }

void ShapeCtx::require_float(const ValueInfo& info, const char* what) const {
  if (info.dtype != DType::f32 && info.dtype != DType::f64)
    fail(std::string(what) + " must be a float tensor (f32 or f64), received " + dtype_name(info.dtype) +
         info.shape.str());
}

void ShapeCtx::require_dtype(const ValueInfo& info, DType dtype, const char* what) const {
  if (info.dtype != dtype)
    fail(std::string(what) + " must have dtype " + dtype_name(dtype) + ", received " + dtype_name(info.dtype) +
         info.shape.str());
}

void ShapeCtx::require_dims(const std::vector<int64_t>& dims, const char* what) const {
  for (int64_t d : dims)
    if (d < 0) fail(std::string(what) + " " + Shape(dims).str() + " has a negative dim");
}

const char* prim_name(PrimId id) {
  static constexpr const char* kNames[] = {
#define KILN_PRIM_NAME(name) #name,
      KILN_PRIMS(KILN_PRIM_NAME)
#undef KILN_PRIM_NAME
  };
  return kNames[static_cast<size_t>(id)];
}

std::optional<PrimId> prim_id(std::string_view name) {
  for (int i = 0; i < kPrimCount; ++i)
    if (static_cast<PrimId>(i) != PrimId::user && name == prim_name(static_cast<PrimId>(i)))
      return static_cast<PrimId>(i);
  return std::nullopt;
}

const PrimDef& PrimRegistry::get(PrimId id) const {
  if (id == PrimId::user) throw Error("user Prims are found by their names (PrimRegistry::find), not by PrimId::user");
  return *prims_.at(static_cast<size_t>(id));
}

const PrimDef* PrimRegistry::find_user(const std::string& name) const {
  std::lock_guard lock(user_mutex_);
  for (const auto& p : user_)
    if (p->name == name) return p.get();
  return nullptr;
}

const PrimDef& PrimRegistry::find(const std::string& name) const {
  if (const std::optional<PrimId> id = prim_id(name)) return get(*id);
  if (const PrimDef* p = find_user(name)) return *p;
  throw Error("unknown Prim '" + name + "'");
}

PrimDef& PrimRegistry::mutable_find(const std::string& name) { return const_cast<PrimDef&>(find(name)); }

std::vector<const PrimDef*> PrimRegistry::all() const {
  std::vector<const PrimDef*> out;
  for (const auto& p : prims_)
    if (p) out.push_back(p.get());
  std::lock_guard lock(user_mutex_);
  for (const auto& p : user_) out.push_back(p.get());
  return out;
}

const PrimDef& PrimRegistry::add_user(PrimDef def) {
  def.id = PrimId::user;
  if (const std::optional<PrimId> id = prim_id(def.name))
    throw Error("register_prim: the name '" + def.name + "' (registered at " + def.registered_at +
                ") is taken by kiln's own Prim from " + get(*id).family);
  std::lock_guard lock(user_mutex_);
  for (const auto& p : user_)
    if (p->name == def.name)
      throw Error("register_prim: the name '" + def.name + "' is registered twice: at " + p->registered_at +
                  " and at " + def.registered_at);
  user_.push_back(std::make_unique<PrimDef>(std::move(def)));
  return *user_.back();
}

void PrimRegistry::add(PrimDef def, const char* source_file) {
  std::unique_ptr<PrimDef>& slot = prims_.at(static_cast<size_t>(def.id));
  def.name = prim_name(def.id);
  if (slot) throw Error("Prim '" + def.name + "' registered twice");
  def.family = std::filesystem::path(source_file).filename().string();
  slot = std::make_unique<PrimDef>(std::move(def));
}

ScopedVjpOverride::ScopedVjpOverride(const std::string& prim, VjpRule rule)
    : def_(PrimRegistry::instance().mutable_find(prim)), saved_(def_.vjp) {
  def_.vjp = std::move(rule);
}

ScopedVjpOverride::~ScopedVjpOverride() { def_.vjp = saved_; }

}  // namespace kiln
