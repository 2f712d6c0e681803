// What the HTTP/2 guard (server/ops/h2_guard.h) is configured with and what
// it counts, shared with its relay loops (server/ops/h2_relay_loop.h).
#ifndef ROLLPACK_SERVER_OPS_H2_GUARD_OPTIONS_H_
#define ROLLPACK_SERVER_OPS_H2_GUARD_OPTIONS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/time/time.h"
#include "server/ops/auth.h"
#include "server/ops/client_abuse_ledger.h"

namespace rollpack {

class H2TlsContext;

struct H2GuardOptions {
  ClientAbuseLimits limits;
  // With tokens on, each call's token is checked from its headers and the
  // request bytes of refused calls are bounded (server/ops/h2_token_check.h).
  // Not owned; null = no check.
  const Authorizer* auth = nullptr;
  // Connections open at once, from all clients; 0 = no limit.
  int max_connections = 16384;
  // Event loops relaying bytes; connections are spread over them.
  int relay_threads = 2;
  // Bytes of one direction a relay holds while they are in flight (taken
  // from a pool, given back when drained).
  size_t buffer_bytes = size_t{256} << 10;
  // Bytes of clients' buffers all relays may hold at once (whole buffers of
  // buffer_bytes); a connection that finds none free stops reading its
  // socket, so the kernel's TCP window holds the client back, until one is
  // given back. Bounds what clients, authenticated or not, make the guard
  // hold on top of gRPC's --transport-memory, whatever the number of
  // connections. Buffers of gRPC's bytes are not counted: gRPC produces them
  // for calls it accepted. 0 = no bound. rollpackd: --transport-memory / 4.
  int64_t client_buffer_memory = 0;
  // A TLS port without client certificates: the guard ends TLS itself
  // (server/ops/h2_tls_context.h). Null: plaintext.
  std::shared_ptr<H2TlsContext> tls;
  // How long a client may take to complete its TLS handshake.
  absl::Duration tls_handshake_timeout = absl::Seconds(10);
};

// Why the guard refused or closed connections, counted since start.
struct H2GuardCounters {
  std::atomic<int64_t> open{0};
  std::atomic<int64_t> refused_cooling_down{0};
  std::atomic<int64_t> refused_per_client{0};
  std::atomic<int64_t> refused_total{0};
  std::atomic<int64_t> closed_stream_resets{0};
  std::atomic<int64_t> closed_header_block{0};
  std::atomic<int64_t> closed_not_http2{0};
  std::atomic<int64_t> closed_unauthenticated{0};
  // TLS ports: handshakes that failed or took over tls_handshake_timeout.
  std::atomic<int64_t> closed_tls_handshake{0};
  std::atomic<int64_t> streams_reset{0};
  // Clients' buffers held now (client_buffer_memory), the most held at once,
  // and the times a connection found none free and waited.
  std::atomic<int64_t> client_buffer_bytes{0};
  std::atomic<int64_t> client_buffer_peak{0};
  std::atomic<int64_t> client_buffer_waits{0};
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_GUARD_OPTIONS_H_
