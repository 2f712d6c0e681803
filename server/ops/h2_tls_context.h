// The TLS of a guarded TLS port: a port with --tls-cert but no
// --tls-client-ca, where anyone who completes a handshake may speak HTTP/2,
// is fronted by the HTTP/2 guard (server/ops/h2_guard.h) like a plaintext
// one. gRPC 1.51 takes sockets from outside only as plaintext, so the guard
// ends TLS itself (OpenSSL, the library gRPC links on Debian) and relays the
// plaintext; its frame watch, token check and reset budgets then cover the
// port. Mutual-TLS ports stay gRPC's: unknown peers never pass their
// handshake.
//
// What the handshake offers follows gRPC's own TLS server: TLS 1.2 and 1.3
// only, gRPC's TLS 1.2 cipher suites (ECDHE with AES-GCM, none that HTTP/2
// forbids), ALPN "h2" (a client offering protocols without it is refused;
// gRPC clients require it), no client certificate, no renegotiation and no
// session resumption (no tickets to write, no cache to hold).
//
// Certificates rotate as gRPC's do (server/ops/watched_tls.h): the files are
// looked at again once `refresh` has passed, when a connection arrives, and
// new handshakes use what changed; open connections keep theirs. A file
// that no longer reads as a certificate and its key keeps the old one in use
// (logged).
#ifndef ROLLPACK_SERVER_OPS_H2_TLS_CONTEXT_H_
#define ROLLPACK_SERVER_OPS_H2_TLS_CONTEXT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/ops/h2_tls_stream.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace rollpack {

class H2TlsContext {
 public:
  // INVALID_ARGUMENT naming the flag and path when `cert_path` (a PEM chain,
  // leaf first) or `key_path` (its PEM key) cannot be read or do not match.
  static absl::StatusOr<std::shared_ptr<H2TlsContext>> Create(std::string cert_path,
                                                              std::string key_path,
                                                              absl::Duration refresh);
  ~H2TlsContext();

  H2TlsContext(const H2TlsContext&) = delete;
  H2TlsContext& operator=(const H2TlsContext&) = delete;

  // The server side of a handshake on `fd` (connected, non-blocking; not
  // owned), with the certificate current at `now`.
  absl::StatusOr<std::unique_ptr<H2TlsStream>> NewStream(int fd, absl::Time now);

 private:
  H2TlsContext(std::string cert_path, std::string key_path, absl::Duration refresh)
      : cert_path_(std::move(cert_path)), key_path_(std::move(key_path)), refresh_(refresh) {}

  // Re-reads the files; a changed pair that loads replaces ctx_.
  absl::Status Refresh(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string cert_path_;
  const std::string key_path_;
  const absl::Duration refresh_;
  absl::Mutex mu_;
  SSL_CTX* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string cert_pem_ ABSL_GUARDED_BY(mu_);
  std::string key_pem_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_TLS_CONTEXT_H_
