// Which failed calls retrying cannot fix, and what the error then says
// (docs/operations.md, "Client errors"). Retry loops (TrainerStream here,
// the Python producer in rollpack/connect_failure.py, which mirrors this
// file) ask ClassifyFailure before waiting:
//
// - kPermanent: the TLS handshake failed (certificate not signed by the CA
//   given, name not in the certificate, TLS to a plaintext server), or the
//   server refused the credentials (UNAUTHENTICATED, PERMISSION_DENIED).
//   The call ends at once.
// - kUnreachable: the address does not resolve, nothing listens on the port,
//   or the connection closed before HTTP/2 started. A server that has not
//   started yet looks the same (a sidecar started a moment after its
//   producer), so a client that never reached `target` waits out
//   `connect_grace` before ending; one that has reached it in this process
//   is riding out a restart and retries for its whole budget.
// - kRetryable: everything else that a loop retried before.
//
// gRPC 1.51 reports all the connection failures as UNAVAILABLE and tells
// them apart only in the message ("Ssl handshake failed: ... certificate
// verify failed", "Connection refused", "DNS resolution failed", "Socket
// closed"): the texts matched here were read from a real rollpackd
// (tests/connect_failure_test.cc).
#ifndef ROLLPACK_CLIENT_CPP_CONNECT_FAILURE_H_
#define ROLLPACK_CLIENT_CPP_CONNECT_FAILURE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace rollpack {

enum class FailureKind { kRetryable, kUnreachable, kPermanent };

// How long a client that never reached its server keeps trying an address
// that does not resolve or refuses connections, unless told otherwise.
inline constexpr absl::Duration kDefaultConnectGrace = absl::Seconds(10);

FailureKind ClassifyFailure(const absl::Status& status);

// Process-wide memory of the addresses ("host:port", as dialled) a call has
// reached: a server answered, whatever it said. "" stands for "some
// address" when a caller does not know its target.
void NoteReached(const std::string& target);
bool WasReached(const std::string& target);

// Whether a server that closed a plaintext connection before HTTP/2 started
// speaks TLS: one handshake with gRPC's default roots (bounded by
// `timeout`); a certificate it cannot verify proves TLS as well as one it
// can.
bool ServerSpeaksTls(const std::string& target, absl::Duration timeout = absl::Seconds(2));

// What a client that is giving up says: the cause, the fix, and that
// retrying cannot fix it; the code stays the call's. `tls`: whether the
// client used TLS. `waited`: how long it tried (kUnreachable).
// `server_speaks_tls`: ServerSpeaksTls's answer, for a plaintext client
// whose connection was closed.
absl::Status ExplainFailure(const absl::Status& status, const std::string& target, bool tls,
                            absl::Duration waited, bool server_speaks_tls = false);

// Whether the failure is "the connection closed before HTTP/2 started"
// (what a plaintext client sees from a TLS server, and a client without the
// certificate a mutual-TLS server asks for).
bool ClosedBeforeHttp2(const absl::Status& status);

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_CONNECT_FAILURE_H_
