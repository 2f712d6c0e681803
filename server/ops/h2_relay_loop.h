// The relaying half of the HTTP/2 guard (server/ops/h2_guard.h): an event
// loop (epoll, edge-triggered) that moves the bytes of many connections
// between each client's socket and gRPC's end of a socket pair, following
// the client's frames on the way. Internal to server/ops.
//
// How a relayed connection ends, so that no byte gRPC wrote is lost and no
// connection outlives its use:
//  - the client ends its side: gRPC's side is ended after the last byte, and
//    the relay finishes once gRPC has ended its own;
//  - gRPC ends its side (its shutdown, --max-connection-idle, an error):
//    what it wrote is flushed to the client, the client's side is ended,
//    and what the client still sends is read and dropped until it closes or
//    kLinger passes (a lingering close: closing with unread input would
//    reset the connection and could drop the client's last bytes);
//  - the guard closes it for abuse: gRPC's side ends at once (gRPC drops its
//    streams), the client gets what was buffered and a GOAWAY, then the same
//    lingering close;
//  - the client's socket fails: the relay finishes at once.
#ifndef ROLLPACK_SERVER_OPS_H2_RELAY_LOOP_H_
#define ROLLPACK_SERVER_OPS_H2_RELAY_LOOP_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/ops/client_abuse_ledger.h"
#include "server/ops/h2_guard_options.h"

namespace rollpack {

// Who a relayed connection is.
struct RelayPeer {
  std::string address;     // gRPC's form: "ipv4:10.0.0.7:51234"
  std::string budget_key;  // the host whose budget it spends (IPv6: its /64)
};

struct GuardedRelay;
struct RelayDirection;
class H2TlsStream;

class H2RelayLoop {
 public:
  // How long a relay that finished its sending may wait for the client to
  // close, and a stopping loop for its relays to flush.
  static constexpr absl::Duration kLinger = absl::Seconds(2);

  static absl::StatusOr<std::unique_ptr<H2RelayLoop>> Create(const H2GuardOptions& options,
                                                             ClientAbuseLedger* ledger,
                                                             H2GuardCounters* counters);
  // Relays left flush what gRPC wrote for up to kLinger, then are closed.
  ~H2RelayLoop();

  // Relays `client_fd` (a connected, non-blocking socket, admitted by the
  // ledger) to `grpc_fd` (the other end of the pair handed to gRPC); both
  // are owned and closed by the loop from here.
  // With `tls` (on `client_fd`), the client's bytes are TLS: the handshake
  // comes first, within options.tls_handshake_timeout, and the plaintext is
  // relayed and watched as a plaintext port's bytes are.
  void Add(int client_fd, int grpc_fd, RelayPeer peer, std::unique_ptr<H2TlsStream> tls = nullptr);

 private:
  H2RelayLoop(const H2GuardOptions& options, ClientAbuseLedger* ledger, H2GuardCounters* counters,
              int epoll_fd, int wake_fd);

  void Run();
  void Wake();
  void Register(std::unique_ptr<GuardedRelay> relay);
  // Moves what can be moved, at most kRoundsPerTurn buffers a direction, so
  // one fast connection cannot hold the loop; a relay cut short is pumped
  // again in the next turn.
  void Pump(GuardedRelay& relay);
  // Moves a TLS relay's handshake on; true once it is done.
  bool Handshake(GuardedRelay& relay);
  bool Move(GuardedRelay& relay, bool upward, bool& progress);
  bool Watch(GuardedRelay& relay, bool from_client, const char* bytes, size_t size);
  // gRPC's end failed or ended: client bytes are dropped from now on.
  void GrpcGone(GuardedRelay& relay);
  // The relay is finished at `deadline` at the latest.
  void FinishBy(GuardedRelay& relay, absl::Time deadline);
  // `goaway`: ENHANCE_YOUR_CALM; `not_http2`: PROTOCOL_ERROR instead.
  void CloseForAbuse(GuardedRelay& relay, const std::string& why, bool goaway, bool cooled_down,
                     bool not_http2 = false);
  void Finish(GuardedRelay& relay);
  // Gives `direction` a buffer to read into; false when it is the client's
  // and options.client_buffer_memory is all held: the relay then waits in
  // starved_ and is pumped again when the loop comes round.
  bool AttachBuffer(GuardedRelay& relay, RelayDirection& direction, bool upward);
  // Gives the direction's buffer back (and its share of the client budget).
  void DetachBuffer(RelayDirection& direction);
  char* AcquireBuffer();
  void ReleaseBuffer(std::unique_ptr<char[]>& buffer);

  const H2GuardOptions& options_;
  ClientAbuseLedger* const ledger_;
  H2GuardCounters* const counters_;
  const int epoll_fd_;
  const int wake_fd_;
  // This loop's thread only.
  absl::flat_hash_map<GuardedRelay*, std::unique_ptr<GuardedRelay>> relays_;
  std::vector<GuardedRelay*> finished_;   // erased after each turn
  std::vector<GuardedRelay*> cut_short_;  // pumped again next turn
  std::vector<GuardedRelay*> lingering_;  // with a finish_by
  std::vector<GuardedRelay*> handshaking_;  // TLS, with a handshake_by
  std::vector<GuardedRelay*> starved_;      // waiting for a client buffer
  std::vector<std::unique_ptr<char[]>> spare_buffers_;

  absl::Mutex mu_;
  std::vector<std::unique_ptr<GuardedRelay>> incoming_ ABSL_GUARDED_BY(mu_);
  absl::Time stop_by_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread thread_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_RELAY_LOOP_H_
