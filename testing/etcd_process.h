// A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests: one or more
// members on 127.0.0.1, free ports picked by the kernel, a temporary data
// dir; the destructor kills them and removes the dir. Stop() and Restart()
// keep a member's data dir, as an operator's restart does.
#ifndef ROLLPACK_TESTING_ETCD_PROCESS_H_
#define ROLLPACK_TESTING_ETCD_PROCESS_H_

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rollpack {

// A port the kernel just gave out and took back: free unless another
// process takes it in between (tests retry the start once).
inline int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Where etcd's client port listens and what client_url() names.
struct EtcdProcessOptions {
  // "0.0.0.0" also takes clients in network namespaces behind veth pairs
  // (rollpack bench cluster --mode fetch --link-gbps).
  std::string client_listen_host = "127.0.0.1";
  // The host in client_url(): with 0.0.0.0 above, an address of this host
  // the clients can reach (the host's end of a veth pair).
  std::string client_advertise_host = "127.0.0.1";
  // TLS on the client port (https://) when set: etcd's certificate and key
  // files, and the CA whose client certificates it requires
  // (--client-cert-auth; with auth enabled, the certificate's CN is the user).
  std::string server_cert;
  std::string server_key;
  std::string client_ca;
  // etcd's --max-request-bytes: docs/cluster.md asks a cluster's etcd for
  // 16 MiB; a test of a step record past the limit lowers it.
  int64_t max_request_bytes = 16777216;
};

// `size` etcd members forming one etcd cluster.
class EtcdProcess {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";

  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(int size = 1) {
    return Start(size, EtcdProcessOptions());
  }
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(int size, EtcdProcessOptions options) {
    if (access(kBinary, X_OK) != 0) {
      return absl::FailedPreconditionError("no /usr/bin/etcd: run `make deps`");
    }
    std::string dir = (std::filesystem::temp_directory_path() / "rollpack-etcd-XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(dir));
    etcd->options_ = std::move(options);
    for (int i = 0; i < size; ++i) {
      etcd->members_.push_back({absl::StrCat("m", i), PickFreePort(), PickFreePort(), -1});
    }
    for (int i = 0; i < size; ++i) {
      if (absl::Status s = etcd->Launch(i); !s.ok()) return s;
    }
    for (int i = 0; i < size; ++i) {
      if (absl::Status s = etcd->AwaitListening(i); !s.ok()) return s;
    }
    return etcd;
  }

  ~EtcdProcess() {
    for (size_t i = 0; i < members_.size(); ++i) Stop(static_cast<int>(i));
    std::filesystem::remove_all(dir_);
  }

  // kill -9 of member `i`, its data dir kept.
  void Stop(int i = 0) {
    Member& m = members_[i];
    if (m.pid <= 0) return;
    kill(m.pid, SIGKILL);
    waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
  // SIGSTOP of member `i`: its sockets stay open and nothing answers (a
  // frozen host, a long GC or I/O stall); Resume() lets it go on, with its
  // clock having run meanwhile (leases past their TTL expire then).
  void Pause(int i = 0) {
    if (members_[i].pid > 0) kill(members_[i].pid, SIGSTOP);
  }
  void Resume(int i = 0) {
    if (members_[i].pid > 0) kill(members_[i].pid, SIGCONT);
  }
  absl::Status Restart(int i = 0) {
    Stop(i);
    if (absl::Status s = Launch(i); !s.ok()) return s;
    return AwaitListening(i);
  }

  std::string client_url(int i = 0) const {
    return absl::StrCat(options_.server_cert.empty() ? "http://" : "https://",
                        options_.client_advertise_host, ":", members_[i].client_port);
  }
  // Every member's client URL, comma-separated (rollpackd --cluster-etcd).
  std::string client_urls() const {
    std::string out;
    for (size_t i = 0; i < members_.size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "" : ",", client_url(static_cast<int>(i)));
    }
    return out;
  }
  // The temporary directory of the members' data and logs.
  const std::string& dir() const { return dir_; }

 private:
  struct Member {
    std::string name;
    int client_port;
    int peer_port;
    pid_t pid;
  };

  explicit EtcdProcess(std::string dir) : dir_(std::move(dir)) {}

  std::string peer_url(int i) const {
    return absl::StrCat("http://127.0.0.1:", members_[i].peer_port);
  }

  absl::Status Launch(int i) {
    Member& m = members_[i];
    std::string initial;
    for (size_t j = 0; j < members_.size(); ++j) {
      absl::StrAppend(&initial, j == 0 ? "" : ",", members_[j].name, "=",
                      peer_url(static_cast<int>(j)));
    }
    std::vector<std::string> args = {
        kBinary,
        "--name=" + m.name,
        absl::StrCat("--data-dir=", dir_, "/", m.name),
        absl::StrCat("--listen-client-urls=", options_.server_cert.empty() ? "http://" : "https://",
                     options_.client_listen_host, ":", m.client_port),
        "--advertise-client-urls=" + client_url(i),
        "--listen-peer-urls=" + peer_url(i),
        "--initial-advertise-peer-urls=" + peer_url(i),
        "--initial-cluster=" + initial,
        "--initial-cluster-token=rollpack-test",
        // As docs/cluster.md asks of a cluster's etcd: a step record holds
        // its sample ids and lengths (tens of bytes a sample).
        absl::StrCat("--max-request-bytes=", options_.max_request_bytes),
        "--log-level=error",
        "--logger=zap"};
    if (!options_.server_cert.empty()) {
      args.push_back("--cert-file=" + options_.server_cert);
      args.push_back("--key-file=" + options_.server_key);
      args.push_back("--trusted-ca-file=" + options_.client_ca);
      args.push_back("--client-cert-auth");
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = absl::StrCat(dir_, "/", m.name, ".log");
    m.pid = fork();
    if (m.pid < 0) return absl::InternalError("fork failed");
    if (m.pid == 0) {
      // A test that dies (an abort, a signal) takes its etcd with it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      FILE* out = std::freopen(log.c_str(), "a", stderr);
      (void)out;
      execv(kBinary, argv.data());
      _exit(127);
    }
    return absl::OkStatus();
  }

  // Ready once its client port accepts connections.
  absl::Status AwaitListening(int i) {
    Member& m = members_[i];
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(m.pid, &status, WNOHANG) == m.pid) {
        m.pid = -1;
        return absl::UnavailableError(absl::StrCat("etcd ", m.name, " exited (status ", status,
                                                   "), see ", dir_, "/", m.name, ".log"));
      }
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(m.client_port);
      const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      close(fd);
      if (up) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat("etcd ", m.name, " did not listen in 30 s"));
  }

  const std::string dir_;
  EtcdProcessOptions options_;
  std::vector<Member> members_;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_ETCD_PROCESS_H_
