// One log line per call an operator wants to read back: who called (peer and
// token role), what, the outcome and the message the client got, how long it
// took, and what the handler had to say (a step's plan stats, the
// micro-batches a trainer stream carried).
//
// Levels: control calls that succeed are info; data calls that succeed
// (PutSamples) and health/reflection are debug; every failure is a warning
// with the client's message, at most a few per method and code every 10 s
// (the next line says how many were dropped), so a client retrying in a loop
// cannot flood the log.
#ifndef ROLLPACK_SERVER_OPS_CALL_LOG_H_
#define ROLLPACK_SERVER_OPS_CALL_LOG_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/ops/auth.h"
#include "server/ops/log_rate_limiter.h"

namespace rollpack {

// Adds `note` to the log line of the call handled in `context` (the last
// note wins). A no-op for calls no CallLog intercepts.
void AnnotateCall(const grpc::ServerContextBase* context, std::string note);

struct CallLogOptions {
  int warnings_per_window = 5;
  absl::Duration warning_window = absl::Seconds(10);
};

class CallLog {
 public:
  // `auth` names the caller's role (may be null: auth off); it must outlive
  // the calls.
  explicit CallLog(const Authorizer* auth, CallLogOptions options = {});

  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();

  struct Call {
    std::string method;  // "/rollpack.v1.Scheduler/CreateStep"
    std::string peer;    // "ipv4:127.0.0.1:50312"
    std::string role;    // "trainer", "unknown token", ...; empty with auth off
    grpc::StatusCode code = grpc::StatusCode::OK;
    std::string message;
    absl::Duration elapsed;
    std::string note;
  };
  // Writes the line for a finished call (the interceptor's end; public for tests).
  void Log(const Call& call);

  // The line Log() writes, without the level (exposed for tests).
  static std::string Format(const Call& call, int64_t dropped_before);

 private:
  const Authorizer* const auth_;
  LogRateLimiter warnings_;

  friend class CallLogInterceptor;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_CALL_LOG_H_
