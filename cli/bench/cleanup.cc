#include "cli/bench/cleanup.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <thread>

#include "absl/base/const_init.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {
namespace {

ABSL_CONST_INIT absl::Mutex registry_mu(absl::kConstInit);
// Leaked on purpose: the watcher may use it while static destructors run.
std::map<int, std::function<void()>>* actions ABSL_GUARDED_BY(registry_mu) = nullptr;
int next_id ABSL_GUARDED_BY(registry_mu) = 0;
bool installed ABSL_GUARDED_BY(registry_mu) = false;
int signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  const int saved = errno;
  (void)!write(signal_pipe[1], &byte, 1);
  errno = saved;
}

void Watch() {
  unsigned char sig = 0;
  while (true) {
    const ssize_t n = read(signal_pipe[0], &sig, 1);
    if (n == 1) break;
    if (n < 0 && errno == EINTR) continue;
    return;  // the pipe is gone: nothing to watch
  }
  std::fprintf(stderr, "\nrollpack: signal %d: cleaning up\n", sig);
  {
    absl::MutexLock lock(&registry_mu);
    if (actions != nullptr) {
      for (auto it = actions->rbegin(); it != actions->rend(); ++it) it->second();
    }
  }
  _exit(128 + sig);
}

}  // namespace

void CatchTerminatingSignals() {
  absl::MutexLock lock(&registry_mu);
  if (installed) return;
  installed = true;
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) {
    std::perror("rollpack: pipe for the signal watcher");
    return;
  }
  std::thread(Watch).detach();
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

int AddCleanupAction(std::function<void()> action) {
  absl::MutexLock lock(&registry_mu);
  if (actions == nullptr) actions = new std::map<int, std::function<void()>>();
  const int id = next_id++;
  (*actions)[id] = std::move(action);
  return id;
}

void RemoveCleanupAction(int id) {
  absl::MutexLock lock(&registry_mu);
  if (actions != nullptr) actions->erase(id);
}

}  // namespace rollpack
