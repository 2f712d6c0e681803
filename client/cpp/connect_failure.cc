#include "client/cpp/connect_failure.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"

namespace rollpack {
namespace {

constexpr char kRetryCannotFix[] = "; retrying cannot fix this";

bool Contains(const absl::Status& status, absl::string_view text) {
  return absl::StrContains(absl::AsciiStrToLower(status.message()), absl::AsciiStrToLower(text));
}

// Whether the failure is this client's own connection attempt, which gRPC
// words "failed to connect to all addresses; last error: ..." or "DNS
// resolution failed for ...", and not a server's answer that quotes one of
// its own (a member whose etcd or peer refused it says "Connection
// refused" too, and the client reached that member).
bool OwnConnectionFailed(const absl::Status& status) {
  const std::string message = absl::AsciiStrToLower(status.message());
  return absl::StartsWith(message, "failed to connect to all addresses") ||
         absl::StartsWith(message, "dns resolution failed");
}

bool TlsHandshakeFailed(const absl::Status& status) {
  return Contains(status, "handshake failed") || Contains(status, "SSL_ERROR") ||
         Contains(status, "is not in peer certificate");
}

bool Refused(const absl::Status& status) {
  return Contains(status, "Connection refused") ||
         Contains(status, "Failed to connect to remote host");
}

bool Unresolved(const absl::Status& status) { return Contains(status, "DNS resolution failed"); }

struct ReachedTargets {
  absl::Mutex mu;
  std::set<std::string> targets ABSL_GUARDED_BY(mu);
};

ReachedTargets& Reached() {
  static ReachedTargets* const reached = new ReachedTargets;  // never destroyed
  return *reached;
}

// " for 10.2s", or nothing for a call that was not retried.
std::string For(absl::Duration waited) {
  if (waited <= absl::ZeroDuration()) return "";
  return absl::StrCat(" for ", absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(100))));
}

}  // namespace

bool ClosedBeforeHttp2(const absl::Status& status) {
  // "failed to connect to all addresses; last error: UNAVAILABLE: ...:
  // Socket closed": the connection was made and closed during the
  // handshakes, not a call on a connection that was up.
  return Contains(status, "failed to connect") && Contains(status, "Socket closed");
}

FailureKind ClassifyFailure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return FailureKind::kPermanent;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      if (!OwnConnectionFailed(status)) return FailureKind::kRetryable;
      if (TlsHandshakeFailed(status)) return FailureKind::kPermanent;
      if (Refused(status) || Unresolved(status) || ClosedBeforeHttp2(status)) {
        return FailureKind::kUnreachable;
      }
      return FailureKind::kRetryable;
    default:
      return FailureKind::kRetryable;
  }
}

void NoteReached(const std::string& target) {
  ReachedTargets& r = Reached();
  absl::MutexLock lock(&r.mu);
  r.targets.insert(target);
  r.targets.insert("");
}

bool WasReached(const std::string& target) {
  ReachedTargets& r = Reached();
  absl::MutexLock lock(&r.mu);
  return r.targets.count(target) > 0;
}

bool ServerSpeaksTls(const std::string& target, absl::Duration timeout) {
  grpc::ChannelArguments args;
  // A connection of its own: never one a plaintext channel shares.
  args.SetString("rollpack.tls_probe", target);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, grpc::SslCredentials({}), args);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC, channel);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, &context, request, &response);
  if (status.ok() || status.error_code() != grpc::StatusCode::UNAVAILABLE) return true;
  const absl::Status failure(absl::StatusCode::kUnavailable, status.error_message());
  return Contains(failure, "certificate verify failed") ||
         Contains(failure, "is not in peer certificate");
}

absl::Status ExplainFailure(const absl::Status& status, const std::string& target, bool tls,
                            absl::Duration waited, bool server_speaks_tls) {
  if (status.ok()) return status;
  const std::string cause = absl::StrCat(" (", status.message(), ")");
  std::string text;
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    text = absl::StrCat("rollpackd at ", target, " refused the credentials", cause,
                        ": pass a token its --auth-tokens file lists (token / --token)",
                        kRetryCannotFix);
  } else if (status.code() == absl::StatusCode::kPermissionDenied) {
    text = absl::StrCat("rollpackd at ", target, " denied the call", cause,
                        ": the token's role may not make it (docs/operations.md, "
                        "\"Authentication\")",
                        kRetryCannotFix);
  } else if (TlsHandshakeFailed(status)) {
    std::string why;
    if (Contains(status, "certificate verify failed")) {
      why =
          "the server's certificate is not signed by the CA this client trusts (the one "
          "given as root_certificates / --root-cert; none given: the system's roots): pass the CA "
          "that signed rollpackd's --tls-cert";
    } else if (Contains(status, "is not in peer certificate")) {
      why =
          "the server's certificate does not name the host dialled: dial a name it lists, "
          "or set the TLS server name (server_name / --server-name)";
    } else if (Contains(status, "wrong version number") || Contains(status, "packet length")) {
      why =
          "the server does not speak TLS (rollpackd without --tls-cert): connect without "
          "TLS, or start rollpackd with --tls-cert";
    } else {
      why =
          "check the CA (root_certificates / --root-cert) and, for mutual TLS, the client "
          "certificate and key";
    }
    text =
        absl::StrCat("TLS handshake with ", target, " failed", cause, ": ", why, kRetryCannotFix);
  } else if (ClosedBeforeHttp2(status) && !tls && server_speaks_tls) {
    text = absl::StrCat(target, " speaks TLS (rollpackd --tls-cert) and this client does not",
                        cause, ": connect with TLS (tls or root_certificates / --tls, --root-cert)",
                        kRetryCannotFix);
  } else if (ClosedBeforeHttp2(status)) {
    text = absl::StrCat(
        target, " closed every connection before HTTP/2 started", For(waited), cause,
        tls ? ": a mutual-TLS rollpackd (--tls-client-ca) does so without a client certificate "
              "signed by that CA (client_certificate and client_key / --client-cert, --client-key)"
            : ": it may expect TLS (connect with TLS: tls / --tls)",
        ", or it refuses this client (connection limits)");
  } else if (Refused(status)) {
    text = absl::StrCat("nothing accepts connections at ", target, " (connection refused)",
                        For(waited), cause,
                        ": is rollpackd running there, and listening on that port (--listen)?",
                        waited > absl::ZeroDuration()
                            ? " A client waits this long (connect_grace) for a server it never "
                              "reached"
                            : "");
  } else if (Unresolved(status)) {
    text = absl::StrCat("the host of ", target, " does not resolve", For(waited), cause,
                        ": check the address");
  } else {
    return status;
  }
  return absl::Status(status.code(), text);
}

}  // namespace rollpack
