// Starting a child process the way every test and benchmark here does: the
// child dies with its parent (a test that aborts takes its servers with
// it), and its standard output and error may go to a given descriptor.
#ifndef ROLLPACK_TESTING_CHILD_PROCESS_H_
#define ROLLPACK_TESTING_CHILD_PROCESS_H_

#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rollpack {

struct ChildOutput {
  // -1: inherited from this process.
  int stdout_fd = -1;
  int stderr_fd = -1;
  // Descriptors the child must not keep (the other end of a pipe).
  std::vector<int> close_in_child;
};

// Forks and execs `argv[0]` with `argv`; the child's pid. An exec that fails
// shows as the child exiting with status 127.
inline absl::StatusOr<pid_t> SpawnChild(std::vector<std::string> argv,
                                        const ChildOutput& output = {}) {
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (output.stdout_fd >= 0) dup2(output.stdout_fd, STDOUT_FILENO);
    if (output.stderr_fd >= 0) dup2(output.stderr_fd, STDERR_FILENO);
    for (int fd : output.close_in_child) close(fd);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_CHILD_PROCESS_H_
