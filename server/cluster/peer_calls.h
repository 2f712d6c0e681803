// How one cluster member calls the others (cluster_steps.cc,
// cluster_choice.cc): deadlines, a peer's status as the caller's, and
// calls to every member at once.
#ifndef ROLLPACK_SERVER_CLUSTER_PEER_CALLS_H_
#define ROLLPACK_SERVER_CLUSTER_PEER_CALLS_H_

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace rollpack {

inline void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

// A peer's answer as the caller's status: the peer's own code (its error
// names the sample or step), except that a member that does not answer is
// UNAVAILABLE naming it.
inline absl::Status FromPeer(const grpc::Status& status, const std::string& member,
                             absl::string_view call) {
  if (status.ok()) return absl::OkStatus();
  const auto code = status.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
      code == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::UnavailableError(absl::StrCat("cluster member ", member, " does not answer (",
                                               call, "): ", status.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("member ", member, ": ", status.error_message()));
}

// Runs fn(0..n-1) on threads of their own (one per member: few) and waits.
inline void ForEachParallel(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 1) {
    fn(0);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (std::thread& t : threads) t.join();
}

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_PEER_CALLS_H_
