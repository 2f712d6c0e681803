#include "server/ops/h2_relay_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/ops/h2_frame_watch.h"
#include "server/ops/h2_tls_stream.h"
#include "server/ops/h2_token_check.h"
#include "server/ops/log_rate_limiter.h"

namespace rollpack {
namespace {

// Buffers one direction may move per turn of the loop.
constexpr int kRoundsPerTurn = 8;
// Freed buffers a loop keeps for the next burst.
constexpr size_t kSpareBuffers = 32;
// A connection closed for abuse: how long its GOAWAY may take to leave.
constexpr absl::Duration kGoawayLinger = absl::Seconds(1);

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

LogRateLimiter& RelayLogLimiter() {
  static LogRateLimiter* const limiter = new LogRateLimiter(5, absl::Seconds(10));
  return *limiter;
}

}  // namespace

// One direction: bytes read from one socket, written to the other in order.
struct RelayDirection {
  std::unique_ptr<char[]> buffer;
  size_t begin = 0;
  size_t end = 0;
  bool readable = true;  // no EAGAIN on the source since its last readiness event
  bool writable = true;
  bool eof = false;      // the source ended, or is no longer read for forwarding
  bool discard = false;  // what the source still sends is read and dropped
  bool shut = false;     // the destination was shut for writing after the last byte
  bool charged = false;  // buffer counted in the client budget
};

struct GuardedRelay {
  GuardedRelay(int client, int grpc, RelayPeer who, const Authorizer* auth)
      : client_fd(client),
        grpc_fd(grpc),
        peer(std::move(who)),
        token_check(auth != nullptr && auth->enabled() ? std::make_unique<H2TokenCheck>(auth)
                                                       : nullptr),
        from_client(H2FrameWatch::Direction::kFromClient,
                    H2FrameWatch::kDefaultMaxHeaderBlockBytes, token_check.get(), &open_streams),
        from_server(H2FrameWatch::Direction::kFromServer, H2FrameWatch::kDefaultMaxHeaderBlockBytes,
                    token_check.get(), &open_streams) {}

  int client_fd;
  int grpc_fd;
  RelayPeer peer;
  // Before the watches that report to it.
  std::unique_ptr<H2TokenCheck> token_check;
  // Before the watches too: the client's resets of streams the server ended
  // are not spent from its budget (server/ops/h2_open_streams.h).
  H2OpenStreams open_streams;
  RelayDirection up;    // client -> gRPC
  RelayDirection down;  // gRPC -> client
  H2FrameWatch from_client;
  H2FrameWatch from_server;
  // Finished by then whatever the client does (a lingering close).
  absl::Time finish_by = absl::InfiniteFuture();
  bool done = false;
  // A TLS port's: the client's socket is read and written through it.
  std::unique_ptr<H2TlsStream> tls;
  absl::Time handshake_by = absl::InfiniteFuture();
  bool starved = false;  // in the loop's starved_
};

namespace {

// The client's side of a relay: its socket, or the TLS on it.
ssize_t ClientRecv(GuardedRelay& relay, char* buffer, size_t size) {
  return relay.tls != nullptr ? relay.tls->Recv(buffer, size)
                              : recv(relay.client_fd, buffer, size, 0);
}

ssize_t ClientSend(GuardedRelay& relay, const char* buffer, size_t size) {
  return relay.tls != nullptr ? relay.tls->Send(buffer, size)
                              : send(relay.client_fd, buffer, size, MSG_NOSIGNAL);
}

// Scanners and clients that do not trust the certificate fail handshakes
// all day: a line now and then, not one each.
void LogTlsFailure(const GuardedRelay& relay, const std::string& why) {
  int64_t dropped = 0;
  if (RelayLogLimiter().Allow("tls handshake", absl::Now(), &dropped)) {
    spdlog::info("h2 guard: closed the connection of {}: {}{}", relay.peer.address, why,
                 dropped > 0 ? absl::StrCat(" (", dropped, " such lines dropped)") : "");
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<H2RelayLoop>> H2RelayLoop::Create(const H2GuardOptions& options,
                                                                 ClientAbuseLedger* ledger,
                                                                 H2GuardCounters* counters) {
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("epoll_create1: ", std::strerror(errno)));
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  if (wake_fd < 0 || epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev) != 0) {
    const int err = errno;
    close(epoll_fd);
    if (wake_fd >= 0) close(wake_fd);
    return absl::ResourceExhaustedError(absl::StrCat("eventfd: ", std::strerror(err)));
  }
  return std::unique_ptr<H2RelayLoop>(
      new H2RelayLoop(options, ledger, counters, epoll_fd, wake_fd));
}

H2RelayLoop::H2RelayLoop(const H2GuardOptions& options, ClientAbuseLedger* ledger,
                         H2GuardCounters* counters, int epoll_fd, int wake_fd)
    : options_(options),
      ledger_(ledger),
      counters_(counters),
      epoll_fd_(epoll_fd),
      wake_fd_(wake_fd) {
  thread_ = std::thread([this] { Run(); });
}

H2RelayLoop::~H2RelayLoop() {
  {
    absl::MutexLock lock(&mu_);
    stop_by_ = absl::Now() + kLinger;
  }
  Wake();
  thread_.join();
  for (auto& [relay, owned] : relays_) Finish(*relay);
  std::vector<std::unique_ptr<GuardedRelay>> incoming;
  {
    absl::MutexLock lock(&mu_);
    incoming.swap(incoming_);
  }
  for (auto& relay : incoming) Finish(*relay);
  close(epoll_fd_);
  close(wake_fd_);
}

void H2RelayLoop::Add(int client_fd, int grpc_fd, RelayPeer peer,
                      std::unique_ptr<H2TlsStream> tls) {
  auto relay = std::make_unique<GuardedRelay>(client_fd, grpc_fd, std::move(peer), options_.auth);
  relay->tls = std::move(tls);
  {
    absl::MutexLock lock(&mu_);
    incoming_.push_back(std::move(relay));
  }
  Wake();
}

void H2RelayLoop::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void H2RelayLoop::Run() {
  // OpenSSL writes a TLS port's sockets with write(2), which raises SIGPIPE
  // on a connection the client reset: blocked on this thread, the write
  // fails with EPIPE instead of ending the process.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  std::vector<epoll_event> events(256);
  std::vector<std::unique_ptr<GuardedRelay>> incoming;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!incoming_.empty()) incoming.swap(incoming_);
      if (stop_by_ != absl::InfiniteFuture() && (relays_.empty() || absl::Now() >= stop_by_)) {
        return;
      }
    }
    for (auto& relay : incoming) Register(std::move(relay));
    incoming.clear();
    // A relay cut short has bytes waiting that no new event will announce;
    // a starved one waits for a buffer another loop may give back.
    const int timeout_ms = !cut_short_.empty() ? 0 : !starved_.empty() ? 5 : 100;
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    std::vector<GuardedRelay*> again;
    again.swap(cut_short_);
    for (GuardedRelay* relay : again) {
      if (!relay->done) Pump(*relay);
    }
    again.clear();
    again.swap(starved_);
    for (GuardedRelay* relay : again) {
      relay->starved = false;
      if (!relay->done) Pump(*relay);
    }
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == nullptr) {
        uint64_t drained;
        (void)!read(wake_fd_, &drained, sizeof(drained));
        continue;
      }
      const auto bits = reinterpret_cast<uintptr_t>(tag);
      GuardedRelay* relay = reinterpret_cast<GuardedRelay*>(bits & ~uintptr_t{1});
      if (relay->done) continue;
      const bool grpc_side = (bits & 1) != 0;
      const uint32_t what = events[i].events;
      const bool in = (what & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
      const bool out = (what & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0;
      RelayDirection& read_side = grpc_side ? relay->down : relay->up;
      RelayDirection& write_side = grpc_side ? relay->up : relay->down;
      read_side.readable |= in;
      write_side.writable |= out;
      Pump(*relay);
    }
    const absl::Time now = absl::Now();
    for (GuardedRelay* relay : lingering_) {
      if (!relay->done && now >= relay->finish_by) Finish(*relay);
    }
    for (GuardedRelay* relay : handshaking_) {
      if (relay->done || now < relay->handshake_by || relay->tls->established()) continue;
      counters_->closed_tls_handshake++;
      LogTlsFailure(*relay, "no TLS handshake within the handshake timeout");
      Finish(*relay);
    }
    handshaking_.erase(std::remove_if(handshaking_.begin(), handshaking_.end(),
                                      [](GuardedRelay* relay) {
                                        return relay->done || relay->tls->established();
                                      }),
                       handshaking_.end());
    const auto is_done = [](GuardedRelay* relay) { return relay->done; };
    lingering_.erase(std::remove_if(lingering_.begin(), lingering_.end(), is_done),
                     lingering_.end());
    cut_short_.erase(std::remove_if(cut_short_.begin(), cut_short_.end(), is_done),
                     cut_short_.end());
    starved_.erase(std::remove_if(starved_.begin(), starved_.end(), is_done), starved_.end());
    for (GuardedRelay* relay : finished_) relays_.erase(relay);
    finished_.clear();
  }
}

void H2RelayLoop::Register(std::unique_ptr<GuardedRelay> relay) {
  GuardedRelay* r = relay.get();
  relays_.emplace(r, std::move(relay));
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = r;
  bool ok = epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, r->client_fd, &ev) == 0;
  ev.data.ptr = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(r) | 1);
  ok = ok && epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, r->grpc_fd, &ev) == 0;
  if (!ok) {
    // No events would ever come (e.g. fs.epoll.max_user_watches reached).
    spdlog::error("h2 guard: cannot watch the connection of {}: {}", r->peer.address,
                  std::strerror(errno));
    Finish(*r);
    return;
  }
  if (r->tls != nullptr) {
    r->handshake_by = absl::Now() + options_.tls_handshake_timeout;
    handshaking_.push_back(r);
  }
  Pump(*r);
}

bool H2RelayLoop::Handshake(GuardedRelay& relay) {
  switch (relay.tls->Handshake()) {
    case H2TlsStream::Step::kDone:
      return true;
    case H2TlsStream::Step::kWantRead:
      relay.up.readable = false;  // the socket said EAGAIN: an event comes with more
      return false;
    case H2TlsStream::Step::kWantWrite:
      relay.down.writable = false;
      return false;
    case H2TlsStream::Step::kFailed:
      break;
  }
  counters_->closed_tls_handshake++;
  LogTlsFailure(relay, absl::StrCat("TLS handshake: ", relay.tls->failure()));
  Finish(relay);
  return false;
}

void H2RelayLoop::Pump(GuardedRelay& relay) {
  // gRPC's first bytes wait in the socket pair until the client is through.
  if (relay.tls != nullptr && !relay.tls->established() && !Handshake(relay)) return;
  for (int round = 0; round < kRoundsPerTurn; ++round) {
    bool progress = false;
    if (!Move(relay, /*upward=*/true, progress)) return;
    if (!Move(relay, /*upward=*/false, progress)) return;
    // Both sides sent all they will; the client's side is read to its end
    // (or until finish_by) so that closing sends no reset.
    if (relay.up.shut && relay.down.shut && relay.up.eof) {
      Finish(relay);
      return;
    }
    if (!progress) return;
  }
  cut_short_.push_back(&relay);
}

bool H2RelayLoop::Move(GuardedRelay& relay, bool upward, bool& progress) {
  RelayDirection& d = upward ? relay.up : relay.down;
  const int from = upward ? relay.client_fd : relay.grpc_fd;
  const int to = upward ? relay.grpc_fd : relay.client_fd;
  if (d.end > d.begin && d.writable && !d.shut) {
    const ssize_t n = upward ? send(to, d.buffer.get() + d.begin, d.end - d.begin, MSG_NOSIGNAL)
                             : ClientSend(relay, d.buffer.get() + d.begin, d.end - d.begin);
    if (n > 0) {
      d.begin += static_cast<size_t>(n);
      progress = true;
    } else if (n < 0 && WouldBlock(errno)) {
      d.writable = false;
    } else if (n < 0 && errno == EINTR) {
      progress = true;
    } else if (upward) {
      GrpcGone(relay);
      progress = true;
    } else {
      Finish(relay);  // the client is gone
      return false;
    }
  }
  if (d.begin == d.end) {
    d.begin = d.end = 0;
    if (d.eof && !d.shut) {
      if (!upward && relay.tls != nullptr) relay.tls->SendCloseNotify();
      shutdown(to, SHUT_WR);
      d.shut = true;
      progress = true;
      if (!upward) {
        // gRPC ended and all it wrote went out: the client's side is read
        // and dropped until it closes, for a while.
        GrpcGone(relay);
        FinishBy(relay, absl::Now() + kLinger);
      }
    }
  }
  if (d.readable && (!d.eof || d.discard) && d.end < options_.buffer_bytes &&
      (d.buffer != nullptr || AttachBuffer(relay, d, upward))) {
    const ssize_t n =
        upward ? ClientRecv(relay, d.buffer.get() + d.end, options_.buffer_bytes - d.end)
               : recv(from, d.buffer.get() + d.end, options_.buffer_bytes - d.end, 0);
    if (n > 0) {
      progress = true;
      if (!d.discard) {
        const size_t at = d.end;
        d.end += static_cast<size_t>(n);
        if (!Watch(relay, upward, d.buffer.get() + at, static_cast<size_t>(n))) {
          return !relay.done;
        }
      }
    } else if (n == 0) {
      d.eof = true;
      d.discard = false;
      progress = true;
    } else if (WouldBlock(errno)) {
      d.readable = false;
    } else if (errno == EINTR) {
      progress = true;
    } else if (upward) {
      Finish(relay);  // the client is gone
      return false;
    } else {
      d.eof = true;  // gRPC's end failed: as if it ended
      progress = true;
    }
  }
  if (d.begin == d.end && d.buffer != nullptr && (!d.readable || d.eof || d.discard)) {
    DetachBuffer(d);  // a quiet connection holds no buffer
  }
  return true;
}

bool H2RelayLoop::Watch(GuardedRelay& relay, bool from_client, const char* bytes, size_t size) {
  H2FrameWatch& watch = from_client ? relay.from_client : relay.from_server;
  absl::StatusOr<H2FrameTally> tally = watch.Feed(absl::string_view(bytes, size));
  if (!from_client) {
    // gRPC's own bytes: nothing to hold against the client.
    if (!tally.ok()) spdlog::error("h2 guard: gRPC's frames: {}", tally.status().ToString());
    return true;
  }
  if (!tally.ok()) {
    // A header-block flood cools the host down; a client whose calls are
    // refused (a wrong token) only loses the connection: it is refused
    // anyway, and a trainer beside it on the host keeps its own.
    const absl::StatusCode code = tally.status().code();
    const bool flood = code == absl::StatusCode::kResourceExhausted;
    const bool refused = code == absl::StatusCode::kUnauthenticated;
    (flood ? counters_->closed_header_block
           : refused ? counters_->closed_unauthenticated : counters_->closed_not_http2)++;
    if (flood) ledger_->CoolDown(relay.peer.budget_key, absl::Now());
    CloseForAbuse(relay, std::string(tally.status().message()), /*goaway=*/flood || refused,
                  /*cooled_down=*/flood, /*not_http2=*/!flood && !refused);
    return false;
  }
  counters_->streams_reset += tally->streams_reset + tally->resets_of_ended_streams;
  if (tally->streams_reset == 0) return true;
  if (ledger_->SpendResets(relay.peer.budget_key, tally->streams_reset, absl::Now())) return true;
  counters_->closed_stream_resets++;
  CloseForAbuse(relay,
                absl::StrCat("stream resets over the client host's budget of ",
                             ledger_->limits().reset_budget, " (refilled in 30 s)"),
                /*goaway=*/true, /*cooled_down=*/true);
  return false;
}

void H2RelayLoop::GrpcGone(GuardedRelay& relay) {
  relay.up.shut = true;
  relay.up.begin = relay.up.end = 0;
  if (!relay.up.eof) relay.up.discard = true;
}

void H2RelayLoop::CloseForAbuse(GuardedRelay& relay, const std::string& why, bool goaway,
                                bool cooled_down, bool not_http2) {
  int64_t dropped = 0;
  if (RelayLogLimiter().Allow(why.substr(0, 24), absl::Now(), &dropped)) {
    spdlog::warn("h2 guard: closed the connection of {}: {}{}{}", relay.peer.address, why,
                 cooled_down ? absl::StrCat("; new connections of ", relay.peer.budget_key,
                                            " refused for ",
                                            absl::FormatDuration(ledger_->limits().cooldown))
                             : std::string(),
                 dropped > 0 ? absl::StrCat(" (", dropped, " such lines dropped)") : "");
  }
  // gRPC sees its connection end now and drops every stream of it.
  shutdown(relay.grpc_fd, SHUT_RDWR);
  GrpcGone(relay);
  relay.down.eof = true;
  if ((goaway || not_http2) && relay.from_server.at_frame_boundary()) {
    const std::string frame =
        not_http2 ? ProtocolErrorGoaway(why)
                  : EnhanceYourCalmGoaway(relay.from_client.highest_stream_id(), why);
    RelayDirection& d = relay.down;
    if (d.buffer == nullptr) d.buffer.reset(AcquireBuffer());
    if (options_.buffer_bytes - d.end >= frame.size()) {
      std::memcpy(d.buffer.get() + d.end, frame.data(), frame.size());
      d.end += frame.size();
    }
  }
  FinishBy(relay, absl::Now() + kGoawayLinger);
}

void H2RelayLoop::FinishBy(GuardedRelay& relay, absl::Time deadline) {
  if (relay.finish_by == absl::InfiniteFuture()) lingering_.push_back(&relay);
  relay.finish_by = std::min(relay.finish_by, deadline);
}

void H2RelayLoop::Finish(GuardedRelay& relay) {
  if (relay.done) return;
  relay.done = true;
  // Unread input makes close() send a reset, which can drop what the client
  // has not read yet (a GOAWAY, the last frames): read what is there first.
  char sink[4096];
  for (int i = 0; i < 64 && recv(relay.client_fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, relay.client_fd, nullptr);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, relay.grpc_fd, nullptr);
  close(relay.client_fd);
  close(relay.grpc_fd);
  relay.client_fd = relay.grpc_fd = -1;
  DetachBuffer(relay.up);
  DetachBuffer(relay.down);
  ledger_->ConnectionClosed(relay.peer.budget_key);
  counters_->open--;
  finished_.push_back(&relay);
}

bool H2RelayLoop::AttachBuffer(GuardedRelay& relay, RelayDirection& direction, bool upward) {
  const int64_t size = static_cast<int64_t>(options_.buffer_bytes);
  if (upward) {
    const int64_t limit = options_.client_buffer_memory;
    int64_t held = counters_->client_buffer_bytes.load();
    do {
      if (limit > 0 && held + size > limit) {
        if (!relay.starved) {
          relay.starved = true;
          starved_.push_back(&relay);
          counters_->client_buffer_waits++;
        }
        return false;
      }
    } while (!counters_->client_buffer_bytes.compare_exchange_weak(held, held + size));
    int64_t peak = counters_->client_buffer_peak.load();
    while (peak < held + size &&
           !counters_->client_buffer_peak.compare_exchange_weak(peak, held + size)) {
    }
    direction.charged = true;
  }
  direction.buffer.reset(AcquireBuffer());
  return true;
}

void H2RelayLoop::DetachBuffer(RelayDirection& direction) {
  if (direction.charged) {
    counters_->client_buffer_bytes -= static_cast<int64_t>(options_.buffer_bytes);
    direction.charged = false;
  }
  ReleaseBuffer(direction.buffer);
}

char* H2RelayLoop::AcquireBuffer() {
  if (spare_buffers_.empty()) return new char[options_.buffer_bytes];  // not zeroed
  char* buffer = spare_buffers_.back().release();
  spare_buffers_.pop_back();
  return buffer;
}

void H2RelayLoop::ReleaseBuffer(std::unique_ptr<char[]>& buffer) {
  if (buffer == nullptr) return;
  if (spare_buffers_.size() < kSpareBuffers) spare_buffers_.push_back(std::move(buffer));
  buffer.reset();
}

}  // namespace rollpack
