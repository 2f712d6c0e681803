// A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests: one member
// on 127.0.0.1, free ports picked by the kernel, a temporary data dir; the
// destructor kills it and removes the dir. Stop() and Restart() keep the
// data dir, as an operator's restart does.
#ifndef ROLLPACK_TESTING_ETCD_PROCESS_H_
#define ROLLPACK_TESTING_ETCD_PROCESS_H_

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

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

class EtcdProcess {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";

  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start() {
    if (access(kBinary, X_OK) != 0) {
      return absl::FailedPreconditionError("no /usr/bin/etcd: run `make deps`");
    }
    std::string dir = (std::filesystem::temp_directory_path() / "rollpack-etcd-XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) return absl::InternalError("mkdtemp failed");
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(dir, PickFreePort(), PickFreePort()));
    absl::Status s = etcd->Launch();
    return s.ok() ? absl::StatusOr<std::unique_ptr<EtcdProcess>>(std::move(etcd)) : s;
  }

  ~EtcdProcess() {
    Stop();
    std::filesystem::remove_all(dir_);
  }

  // kill -9, data dir kept.
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  absl::Status Restart() {
    Stop();
    return Launch();
  }

  std::string client_url() const { return absl::StrCat("http://127.0.0.1:", client_port_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", client_port_); }

 private:
  EtcdProcess(std::string dir, int client_port, int peer_port)
      : dir_(std::move(dir)), client_port_(client_port), peer_port_(peer_port) {}

  absl::Status Launch() {
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
    std::vector<std::string> args = {
        kBinary,
        "--name=test",
        "--data-dir=" + dir_ + "/data",
        "--listen-client-urls=" + client_url(),
        "--advertise-client-urls=" + client_url(),
        "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer,
        "--initial-cluster=test=" + peer,
        "--log-level=error",
        "--logger=zap"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir_ + "/etcd.log";
    pid_ = fork();
    if (pid_ < 0) return absl::InternalError("fork failed");
    if (pid_ == 0) {
      FILE* out = std::freopen(log.c_str(), "a", stderr);
      (void)out;
      execv(kBinary, argv.data());
      _exit(127);
    }
    // Ready once its client port accepts connections.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::UnavailableError(absl::StrCat("etcd exited (status ", status, "), see ", log));
      }
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(client_port_);
      const bool up = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      close(fd);
      if (up) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("etcd did not start listening within 30 s");
  }

  const std::string dir_;
  const int client_port_;
  const int peer_port_;
  pid_t pid_ = -1;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_ETCD_PROCESS_H_
