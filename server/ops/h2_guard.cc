#include "server/ops/h2_guard.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/ops/guarded_peers.h"
#include "server/ops/h2_relay_loop.h"
#include "server/ops/h2_tls_context.h"
#include "server/ops/log_rate_limiter.h"

namespace rollpack {
namespace {

// gRPC's form of the peer ("ipv4:10.0.0.7:51234", "ipv6:[2001:db8::1]:5";
// an IPv4 client of a dual-stack socket named as IPv4, as gRPC names it)
// and the host whose budget it spends: the IPv4 address, or an IPv6
// address's /64 (what one host is usually given, so that a host cannot
// escape its budget by changing addresses within it).
RelayPeer NameOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (!IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
      in6_addr prefix = in6.sin6_addr;
      std::memset(prefix.s6_addr + 8, 0, 8);
      char prefix_text[INET6_ADDRSTRLEN] = {};
      inet_ntop(AF_INET6, &prefix, prefix_text, sizeof(prefix_text));
      return {absl::StrCat("ipv6:[", text, "]:", ntohs(in6.sin6_port)),
              absl::StrCat("ipv6:[", prefix_text, "]/64")};
    }
    in_addr v4;
    std::memcpy(&v4, in6.sin6_addr.s6_addr + 12, sizeof(v4));
    inet_ntop(AF_INET, &v4, text, sizeof(text));
    return {absl::StrCat("ipv4:", text, ":", ntohs(in6.sin6_port)), absl::StrCat("ipv4:", text)};
  }
  const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
  inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
  return {absl::StrCat("ipv4:", text, ":", ntohs(in.sin_port)), absl::StrCat("ipv4:", text)};
}

LogRateLimiter& AcceptLogLimiter() {
  static LogRateLimiter* const limiter = new LogRateLimiter(5, absl::Seconds(10));
  return *limiter;
}

void LogLimited(const std::string& key, const std::string& line) {
  int64_t dropped = 0;
  if (AcceptLogLimiter().Allow(key, absl::Now(), &dropped)) {
    spdlog::warn("h2 guard: {}{}", line,
                 dropped > 0 ? absl::StrCat(" (", dropped, " such lines dropped)") : "");
  }
}

// Connections the process can relay: 3 descriptors each (the client's, the
// relay's end and gRPC's end of the pair), 256 kept for everything else.
int ConnectionsTheFileLimitAllows() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<int>(std::min<rlim_t>(
      (std::max<rlim_t>(files.rlim_cur, 512) - 256) / 3, rlim_t{1} << 30));
}

H2GuardOptions WithinTheFileLimit(H2GuardOptions options) {
  const int allowed = ConnectionsTheFileLimitAllows();
  if (allowed > 0 && (options.max_connections == 0 || options.max_connections > allowed)) {
    spdlog::info("h2 guard: at most {} connections at once (RLIMIT_NOFILE allows {} relays of 3 "
                 "descriptors; --max-connections {})",
                 allowed, allowed, options.max_connections);
    options.max_connections = allowed;
  }
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<H2Guard>> H2Guard::Listen(const std::string& listen,
                                                         H2GuardOptions options) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                 std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", listen, "\": ", gai_strerror(rc)));
  }
  // Every address the host resolves to ("localhost": 127.0.0.1 and ::1), on
  // one port: the first bound picks it when `port` is 0.
  std::vector<int> fds;
  int bound_port = port;
  int err = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) {
      // A wildcard takes IPv4 clients too, as gRPC's own listener does.
      const int v6only = host.empty() || host == "::" ? 0 : 1;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
      reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_port = htons(bound_port);
    } else {
      reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_port = htons(bound_port);
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      // A dual-stack wildcard already holds the IPv4 one: not an error.
      if (fds.empty() || errno != EADDRINUSE) err = errno;
      close(fd);
      continue;
    }
    if (bound_port == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      bound_port = bound.ss_family == AF_INET
                       ? ntohs(reinterpret_cast<sockaddr_in&>(bound).sin_port)
                       : ntohs(reinterpret_cast<sockaddr_in6&>(bound).sin6_port);
    }
    fds.push_back(fd);
  }
  freeaddrinfo(found);
  if (fds.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", listen, err == EADDRINUSE ? ": address in use"
                                                       : absl::StrCat(": ", std::strerror(err))));
  }
  const int stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop_fd < 0) {
    for (int fd : fds) close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<H2Guard> guard(
      new H2Guard(std::move(fds), bound_port, stop_fd, WithinTheFileLimit(std::move(options))));
  for (int i = 0; i < std::max(1, guard->options_.relay_threads); ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<H2RelayLoop> loop,
                     H2RelayLoop::Create(guard->options_, &guard->ledger_, guard->counters_.get()));
    guard->loops_.push_back(std::move(loop));
  }
  return guard;
}

H2Guard::H2Guard(std::vector<int> listen_fds, int port, int stop_fd, H2GuardOptions options)
    : options_(std::move(options)),
      port_(port),
      listen_fds_(std::move(listen_fds)),
      stop_fd_(stop_fd),
      ledger_(options_.limits) {}

H2Guard::~H2Guard() {
  StopAccepting();
  loops_.clear();  // flushes, then closes every relay that is left
  for (int fd : listen_fds_) close(fd);
  close(stop_fd_);
}

void H2Guard::Start(grpc::Server* server) {
  accepting_ = true;
  acceptor_ = std::thread([this, server] { AcceptLoop(server); });
}

void H2Guard::StopAccepting() {
  if (!accepting_.exchange(false)) return;
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  acceptor_.join();
}

void H2Guard::AcceptLoop(grpc::Server* server) {
  std::vector<pollfd> watched;
  for (int fd : listen_fds_) watched.push_back({fd, POLLIN, 0});
  watched.push_back({stop_fd_, POLLIN, 0});
  while (accepting_) {
    if (poll(watched.data(), watched.size(), -1) < 0) {
      if (errno != EINTR) absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    if (!accepting_ || watched.back().revents != 0) return;
    for (size_t i = 0; i + 1 < watched.size(); ++i) {
      if (watched[i].revents == 0) continue;
      // Takes what is queued, then polls again.
      for (int taken = 0; taken < 64 && accepting_; ++taken) {
        sockaddr_storage addr{};
        socklen_t len = sizeof(addr);
        const int client = accept4(watched[i].fd, reinterpret_cast<sockaddr*>(&addr), &len,
                                   SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (client >= 0) {
          Admit(server, client, addr);
          continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        // Linux passes the new connection's network errors to accept
        // (ECONNABORTED, ENETDOWN, EPROTO, EPERM from a firewall, ...): the
        // listener itself is fine. Out of descriptors: wait for some to
        // close rather than spin.
        const int err = errno;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
          LogLimited("accept resources", absl::StrCat("accept: ", std::strerror(err)));
          absl::SleepFor(absl::Milliseconds(100));
        } else if (err != EINTR && err != ECONNABORTED) {
          LogLimited("accept", absl::StrCat("accept: ", std::strerror(err)));
        }
        break;
      }
    }
  }
}

void H2Guard::Admit(grpc::Server* server, int client, const sockaddr_storage& addr) {
  RelayPeer peer = NameOf(addr);
  const char* refusal = nullptr;
  if (options_.max_connections > 0 && counters_->open.load() >= options_.max_connections) {
    counters_->refused_total++;
    refusal = "--max-connections connections are open";
  } else if (const ClientAbuseLedger::Admission admission =
                 ledger_.AdmitConnection(peer.budget_key, absl::Now());
             admission == ClientAbuseLedger::Admission::kCoolingDown) {
    counters_->refused_cooling_down++;
    refusal = "the host is cooling down after overdrawing its budget";
  } else if (admission == ClientAbuseLedger::Admission::kTooManyConnections) {
    counters_->refused_per_client++;
    refusal = "the host holds --max-connections-per-client connections";
  }
  if (refusal != nullptr) {
    close(client);
    LogLimited(refusal, absl::StrCat("refused a connection of ", peer.address, ": ", refusal));
    return;
  }
  const int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::unique_ptr<H2TlsStream> tls;
  if (options_.tls != nullptr) {
    absl::StatusOr<std::unique_ptr<H2TlsStream>> stream =
        options_.tls->NewStream(client, absl::Now());
    if (!stream.ok()) {
      LogLimited("tls", stream.status().ToString());
      ledger_.ConnectionClosed(peer.budget_key);
      close(client);
      return;
    }
    tls = *std::move(stream);
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    LogLimited("socketpair", absl::StrCat("socketpair: ", std::strerror(errno)));
    ledger_.ConnectionClosed(peer.budget_key);
    close(client);
    return;
  }
  counters_->open++;
  RecordGuardedPeer(pair[1], peer.address);
  grpc::AddInsecureChannelFromFd(server, pair[1]);  // gRPC owns pair[1] from here
  loops_[next_loop_++ % loops_.size()]->Add(client, pair[0], std::move(peer), std::move(tls));
}

}  // namespace rollpack
