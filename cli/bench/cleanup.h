// Cleanup that must happen however a benchmark ends: the child processes it
// started and the network namespaces, veth pairs and sysctl it changed
// (`rollpack bench cluster --mode fetch --link-gbps`). Destructors cover the
// normal and the error paths; SIGINT, SIGTERM and SIGHUP would skip them, so
// a watcher thread runs the registered actions on those and then exits
// 128 + the signal. Nothing runs on kill -9: MemberLinks::RemoveStale
// removes what a run killed that way left behind.
#ifndef ROLLPACK_CLI_BENCH_CLEANUP_H_
#define ROLLPACK_CLI_BENCH_CLEANUP_H_

#include <functional>
#include <utility>

namespace rollpack {

// Installs the handlers and starts the watcher (once per process; later
// calls do nothing). The handler itself only writes the signal number to a
// pipe, which is async-signal-safe; the watcher thread reads it and cleans
// up. Children exec'd afterwards get the default dispositions back.
void CatchTerminatingSignals();

// Registers `action` to run on such a signal; actions run newest first (a
// process started inside a namespace is killed before the namespace goes).
// Returns an id for RemoveCleanupAction, which the normal path calls once it
// has done the same work itself. An action can run concurrently with the
// normal path's own cleanup of the same thing, so both must be idempotent
// and synchronised; an action must not add or remove actions.
int AddCleanupAction(std::function<void()> action);
void RemoveCleanupAction(int id);

// An action registered for a scope: declare it after what it cleans up, so
// that it is removed before that is destroyed on the normal and the error
// paths (an action left registered would act on a freed object, or kill a
// pid the system has given to another process).
class ScopedCleanupAction {
 public:
  explicit ScopedCleanupAction(std::function<void()> action)
      : id_(AddCleanupAction(std::move(action))) {}
  ~ScopedCleanupAction() { RemoveCleanupAction(id_); }
  ScopedCleanupAction(const ScopedCleanupAction&) = delete;
  ScopedCleanupAction& operator=(const ScopedCleanupAction&) = delete;

 private:
  const int id_;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CLEANUP_H_
