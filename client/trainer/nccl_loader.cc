#include "client/trainer/nccl_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rollpack::trainer_internal {

absl::StatusOr<const Nccl*> LoadNccl() {
  static Nccl nccl;
  static std::string error;
  static bool loaded = [] {
    const char* env = std::getenv("ROLLPACK_NCCL_LIBRARY");
    const std::string path = env != nullptr && *env != 0 ? env : "libnccl.so.2";
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      error = absl::StrCat("cannot load NCCL (", path, "): ", dlerror(),
                           "; set ROLLPACK_NCCL_LIBRARY to libnccl.so.2's path");
      return false;
    }
    bool ok = true;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
      if (*fn == nullptr) {
        ok = false;
        error = absl::StrCat("NCCL library ", path, " lacks ", name);
      }
    };
    sym(&nccl.GetUniqueId, "ncclGetUniqueId");
    sym(&nccl.CommInitRank, "ncclCommInitRank");
    sym(&nccl.CommDestroy, "ncclCommDestroy");
    sym(&nccl.CommAbort, "ncclCommAbort");
    sym(&nccl.Broadcast, "ncclBroadcast");
    sym(&nccl.Send, "ncclSend");
    sym(&nccl.Recv, "ncclRecv");
    sym(&nccl.GroupStart, "ncclGroupStart");
    sym(&nccl.GroupEnd, "ncclGroupEnd");
    sym(&nccl.GetErrorString, "ncclGetErrorString");
    return ok;
  }();
  if (!loaded) return absl::FailedPreconditionError(error);
  return &nccl;
}

absl::Status NcclError(int result, const char* what) {
  // Only a loaded library returns results, so the lookup cannot fail here.
  absl::StatusOr<const Nccl*> nccl = LoadNccl();
  const char* words = nccl.ok() ? (*nccl)->GetErrorString(result) : "unknown NCCL error";
  return absl::InternalError(absl::StrCat(what, ": ", words));
}

}  // namespace rollpack::trainer_internal
