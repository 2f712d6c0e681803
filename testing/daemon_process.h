// Runs rollpackd as a child process on 127.0.0.1 with an ephemeral port,
// for tests that kill and restart it. The destructor kills what is left.
#ifndef ROLLPACK_TESTING_DAEMON_PROCESS_H_
#define ROLLPACK_TESTING_DAEMON_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/child_process.h"

namespace rollpack {

class DaemonProcess {
 public:
  // Starts `binary` with `args` plus --listen 127.0.0.1:0 (unless `args`
  // has a --listen) and --port-file, and
  // waits until it serves (the port file appears) or exits.
  // With `stderr_file`, the process's output (stdout, where it logs, and
  // stderr) is appended there (a test that reads what it logged).
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const std::string& binary, std::vector<std::string> args, const std::string& port_file,
      absl::Duration timeout = absl::Seconds(60), const std::string& stderr_file = "") {
    std::remove(port_file.c_str());
    args.insert(args.begin(), binary);
    // An ephemeral port unless the caller fixed one (a member restarted
    // at the address it is known by).
    bool listen_given = false;
    for (const std::string& a : args) listen_given = listen_given || a.rfind("--listen=", 0) == 0;
    if (!listen_given) args.push_back("--listen=127.0.0.1:0");
    args.push_back("--port-file=" + port_file);
    ChildOutput output;
    if (!stderr_file.empty()) {
      output.stderr_fd = open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (output.stderr_fd < 0) return absl::InternalError("cannot open " + stderr_file);
      output.stdout_fd = output.stderr_fd;  // rollpackd logs to stdout
    }
    absl::StatusOr<pid_t> pid = SpawnChild(std::move(args), output);
    if (output.stderr_fd >= 0) close(output.stderr_fd);
    if (!pid.ok()) return pid.status();
    std::unique_ptr<DaemonProcess> d(new DaemonProcess(*pid));
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int port = 0;
      std::ifstream(port_file) >> port;
      if (port > 0) {
        d->port_ = port;
        return d;
      }
      int status = 0;
      if (waitpid(*pid, &status, WNOHANG) == *pid) {
        d->pid_ = -1;
        return absl::UnavailableError(
            absl::StrCat(binary, " exited with status ", status, " before serving"));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(absl::StrCat(binary, " did not start serving"));
  }

  ~DaemonProcess() { Kill(SIGKILL); }

  // Sends `sig` and reaps the process; returns its wait status.
  int Kill(int sig) {
    if (pid_ <= 0) return 0;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  explicit DaemonProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  int port_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_DAEMON_PROCESS_H_
