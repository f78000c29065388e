// NCCL, the collective library of NVIDIA GPUs, as a table of entry points filled at run time by
// dlopen + dlsym (like libcuda: one kiln binary runs with or without it). Data-parallel training
// on GPUs averages gradients through it (cuda/runtime/collective.hpp). The types and constants
// below are NCCL's ABI (nccl.h), declared here so that building kiln needs no NCCL headers; a
// test compares them with nccl.h where it is installed.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include <kiln/cuda/driver/driver_api.hpp>

namespace kiln::cuda {

using NcclResult = int;  // ncclResult_t
using NcclComm = struct ncclComm*;
constexpr int kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

constexpr NcclResult NCCL_SUCCESS = 0;      // ncclSuccess
constexpr NcclResult NCCL_IN_PROGRESS = 7;  // ncclInProgress
constexpr int NCCL_FLOAT32 = 7;             // ncclFloat32 (ncclDataType_t)
constexpr int NCCL_AVG = 4;                 // ncclAvg (ncclRedOp_t; NCCL 2.10 and later)

struct NcclApi {
  NcclResult (*ncclGetVersion)(int* version);
  NcclResult (*ncclGetUniqueId)(NcclUniqueId* id);
  NcclResult (*ncclCommInitRank)(NcclComm* comm, int nranks, NcclUniqueId id, int rank);
  NcclResult (*ncclCommDestroy)(NcclComm comm);
  NcclResult (*ncclCommAbort)(NcclComm comm);
  NcclResult (*ncclCommGetAsyncError)(NcclComm comm, NcclResult* async_error);
  const char* (*ncclGetErrorString)(NcclResult result);
  NcclResult (*ncclAllReduce)(const void* send, void* recv, size_t count, int datatype, int op, NcclComm comm,
                              CUstream stream);
  NcclResult (*ncclReduceScatter)(const void* send, void* recv, size_t recv_count, int datatype, int op,
                                  NcclComm comm, CUstream stream);
  NcclResult (*ncclAllGather)(const void* send, void* recv, size_t send_count, int datatype, NcclComm comm,
                              CUstream stream);
};

struct Nccl {
  NcclApi api{};
  std::string library;  // the file loaded
  int version = 0;      // ncclGetVersion's: 22809 for 2.28.9
};

// Loads $KILN_NCCL_LIBRARY when set, else libnccl.so.2 from the loader's path, and resolves
// every entry point. nullopt with the reason in *why when the library or a symbol is missing, or
// when it is older than 2.10 (no ncclAvg).
std::optional<Nccl> load_nccl(std::string* why);

}  // namespace kiln::cuda
