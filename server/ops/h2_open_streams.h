// Which of a connection's client streams the server may still be working on,
// so that the HTTP/2 guard (server/ops/h2_guard.h) spends a client's reset
// budget only on resets that are HTTP/2 rapid reset.
//
// Rapid reset (CVE-2023-44487) costs the server because each reset stream
// was set up and handed to a handler that the reset then throws away, and
// because resets let a client open streams without end while never holding
// many open. A reset of a stream the server already ended (its trailers, its
// END_STREAM, its own RST_STREAM) or that the client reset before throws
// nothing away: the server dropped the stream when it ended and looks the id
// up in vain. Such a reset is not spent from the budget: a client that cancels
// calls after their answers is not cut off, however many it cancels.
//
// Not exempted: a reset of a stream opened long ago. Age is no bound on what
// resets cost: gRPC 1.51 does not enforce MAX_CONCURRENT_STREAMS, so a client
// may open 10,000 streams, let them age N ms and reset them all, and every
// one was set up and run for nothing, at 10,000 per N ms. A trainer cancels
// its long-lived streams a few at a time (a restart, a rebalance), far below
// the budget (1000 at once, refilled in 30 s).
//
// O(1) memory per connection. Client stream ids are odd and increase: the
// newest kWindow ids are followed one bit each; a stream still open when it
// leaves that window (a long-lived stream beside many short calls) is kept in
// a list of at most kMaxOldOpen; past that, the oldest are forgotten and
// count as open (spent from the budget if reset), never the reverse.
#ifndef ROLLPACK_SERVER_OPS_H2_OPEN_STREAMS_H_
#define ROLLPACK_SERVER_OPS_H2_OPEN_STREAMS_H_

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rollpack {

class H2OpenStreams {
 public:
  // The newest client stream ids followed one by one (a bit each).
  static constexpr int64_t kWindow = 1024;
  // Streams older than the window that are still open, at most.
  static constexpr size_t kMaxOldOpen = 64;

  // The client opened `stream` (HEADERS with an id above every one before).
  // Ids it skipped are closed (RFC 9113 section 5.1.1). Even ids (the
  // server's) and ids at or below the highest are ignored.
  void Opened(uint32_t stream);

  // `stream` ended on the server: its END_STREAM, or a RST_STREAM either way.
  void Ended(uint32_t stream);

  // Whether resetting `stream` may throw away work of the server: true for
  // a stream opened and not ended, for ids the client has not opened (idle),
  // stream 0, even ids, and old streams forgotten for room.
  bool MayBeOpen(uint32_t stream) const;

 private:
  bool InWindow(int64_t stream) const { return stream > highest_ - 2 * kWindow; }
  static size_t Slot(int64_t stream) { return static_cast<size_t>((stream >> 1) % kWindow); }
  // `stream` (open) leaves the window.
  void KeepOld(int64_t stream);

  int64_t highest_ = -1;          // the highest stream the client opened
  std::bitset<kWindow> open_;     // ids in (highest_ - 2 * kWindow, highest_]
  std::vector<uint32_t> old_open_;  // below the window, open, ascending
  int64_t forgotten_through_ = 0;   // ids up to this one may be open
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_OPEN_STREAMS_H_
