// TLS credentials whose certificates and keys are re-read from their files
// while the process runs (gRPC's FileWatcherCertificateProvider), so that an
// operator rotates them by replacing the files: new handshakes use the new
// ones within the refresh interval, connections already open keep theirs.
// rollpackd's gRPC port, the connections members open to each other and to
// etcd use them (docs/operations.md, "TLS"; docs/cluster.md, "Threat model").
#ifndef ROLLPACK_SERVER_OPS_WATCHED_TLS_H_
#define ROLLPACK_SERVER_OPS_WATCHED_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace rollpack {

// The contents of a PEM file; INVALID_ARGUMENT naming `what` and the path
// when it cannot be read or holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what);

struct WatchedTlsFiles {
  std::string cert;  // PEM certificate chain (empty: none, a client without one)
  std::string key;   // PEM private key of `cert`
  std::string ca;    // PEM CA bundle: clients' (server side) or the server's
};

// A server presenting `files.cert`; with `files.ca`, clients must present a
// certificate it signed (mutual TLS). INVALID_ARGUMENT naming the file when
// one cannot be read or holds no PEM now: a start with a broken file fails
// at once rather than at the first handshake.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> WatchedServerCredentials(
    const WatchedTlsFiles& files, absl::Duration refresh);

// A client trusting `files.ca`, presenting `files.cert` when given. It
// checks the server's name against its certificate; with `peer_identity`, it
// checks instead that the certificate's Common Name is that identity: how a
// cluster member knows it reached a member, whatever address it dialled (a
// pod IP no certificate can list).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> WatchedChannelCredentials(
    const WatchedTlsFiles& files, absl::Duration refresh, const std::string& peer_identity = "");

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_WATCHED_TLS_H_
