// Loads NCCL at run time (see nccl_api.hpp).
#include <dlfcn.h>

#include <cstdlib>

#include <kiln/circuit/ir/settings.hpp>
#include <kiln/cuda/driver/nccl_api.hpp>

namespace kiln::cuda {

std::optional<Nccl> load_nccl(std::string* why) {
  const std::string library = settings().nccl_library;
  // Never closed on success: communicators and captured graphs refer to its code.
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    if (why)
      *why = library + " not found (" + (err ? err : "dlopen failed") +
             "); set KILN_NCCL_LIBRARY to its path (pip's nvidia-nccl-cu12/cu13 ship one)";
    return std::nullopt;
  }
  Nccl n;
  n.library = library;
  NcclApi& a = n.api;
  bool ok = true;
  auto resolve = [&](const char* symbol, auto*& fn) {
    if (!ok) return;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    ok = fn != nullptr;
    if (!ok && why) *why = library + " lacks " + symbol;
  };
  resolve("ncclGetVersion", a.ncclGetVersion);
  resolve("ncclGetUniqueId", a.ncclGetUniqueId);
  resolve("ncclCommInitRank", a.ncclCommInitRank);
  resolve("ncclCommDestroy", a.ncclCommDestroy);
  resolve("ncclCommAbort", a.ncclCommAbort);
  resolve("ncclCommGetAsyncError", a.ncclCommGetAsyncError);
  resolve("ncclGetErrorString", a.ncclGetErrorString);
  resolve("ncclAllReduce", a.ncclAllReduce);
  resolve("ncclReduceScatter", a.ncclReduceScatter);
  resolve("ncclAllGather", a.ncclAllGather);
  if (ok && a.ncclGetVersion(&n.version) != NCCL_SUCCESS) {
    ok = false;
    if (why) *why = library + ": ncclGetVersion failed";
  }
  if (ok && n.version < 21000) {
    ok = false;
    if (why) *why = library + " is NCCL " + std::to_string(n.version) + "; kiln needs 2.10 or later (ncclAvg)";
  }
  if (!ok) {
    dlclose(lib);
    return std::nullopt;
  }
  return n;
}

}  // namespace kiln::cuda
