// The front of a plaintext gRPC port: rollpackd accepts each TCP connection
// itself, relays it to gRPC over a socket pair (grpc::AddInsecureChannelFromFd)
// and follows the client's HTTP/2 frames on the way, so that what gRPC 1.51
// does not bound is bounded before gRPC sees it:
//
//  - stream resets (HTTP/2 rapid reset, CVE-2023-44487): each client host has
//    a budget of RST_STREAM frames of streams the server is still working on
//    (ClientAbuseLimits; server/ops/h2_open_streams.h); a connection that
//    overdraws it gets GOAWAY(ENHANCE_YOUR_CALM) and is closed, which makes
//    gRPC drop every stream of it at once, and the host is refused new
//    connections for a cool-down;
//  - connections: at most so many per client host and in all;
//  - header blocks: a CONTINUATION flood is closed past 64 KiB;
//  - calls without a valid token (with --auth-tokens): their request bytes
//    are bounded per connection (server/ops/h2_token_check.h), as the token
//    gate refuses them from the headers on TLS ports;
//  - anything that is not HTTP/2 is closed at its first bytes.
//
// gRPC 1.51 has no hook for any of this (no stream-reset limit; its
// MAX_CONCURRENT_STREAMS is announced, not enforced), and its transport only
// learns of a reset stream after having set it up. gRPC takes only plaintext
// sockets from outside: on a TLS port without client certificates the guard
// ends TLS itself (options.tls, server/ops/h2_tls_context.h) and relays the
// plaintext; mutual-TLS ports are not fronted, their handshake keeps unknown
// peers out before HTTP/2 starts (docs/operations.md, "Hardening").
//
// The relay (server/ops/h2_relay_loop.h) copies bytes through a buffer of
// `buffer_bytes` per direction, held only while bytes are in flight: an idle
// connection costs its three sockets and about a kilobyte (its HPACK table,
// with tokens, up to what gRPC allows).
#ifndef ROLLPACK_SERVER_OPS_H2_GUARD_H_
#define ROLLPACK_SERVER_OPS_H2_GUARD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/ops/client_abuse_ledger.h"
#include "server/ops/h2_guard_options.h"

struct sockaddr_storage;

namespace grpc {
class Server;
}

namespace rollpack {

class H2RelayLoop;

class H2Guard {
 public:
  // Binds `listen` ("host:port", port 0 = any free one; every address the
  // host resolves to, as gRPC's own listener does) and listens; nothing is
  // accepted before Start.
  static absl::StatusOr<std::unique_ptr<H2Guard>> Listen(const std::string& listen,
                                                         H2GuardOptions options);
  ~H2Guard();

  H2Guard(const H2Guard&) = delete;
  H2Guard& operator=(const H2Guard&) = delete;

  int port() const { return port_; }

  // Accepts connections and hands each to `server`, which must be started
  // and outlive StopAccepting().
  void Start(grpc::Server* server);

  // No new connection is accepted or handed to gRPC; open ones go on (gRPC's
  // own shutdown ends their calls). Call before grpc::Server::Shutdown.
  void StopAccepting();

  // Shared with whoever reads them (metrics) past the guard's end.
  std::shared_ptr<const H2GuardCounters> counters() const { return counters_; }

 private:
  H2Guard(std::vector<int> listen_fds, int port, int stop_fd, H2GuardOptions options);
  void AcceptLoop(grpc::Server* server);
  // Admits or refuses one accepted connection and hands it over.
  void Admit(grpc::Server* server, int client, const sockaddr_storage& addr);

  const H2GuardOptions options_;
  const int port_;
  const std::vector<int> listen_fds_;
  const int stop_fd_;  // an eventfd that wakes the acceptor to stop
  ClientAbuseLedger ledger_;
  std::shared_ptr<H2GuardCounters> counters_ = std::make_shared<H2GuardCounters>();
  std::vector<std::unique_ptr<H2RelayLoop>> loops_;
  size_t next_loop_ = 0;
  std::thread acceptor_;
  std::atomic<bool> accepting_{false};
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_GUARD_H_
