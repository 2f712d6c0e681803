// A fixed set of threads running queued work in FIFO order: ingest parses
// and validates one PutSamples stream's messages in parallel on one
// (server/ingest/put_samples_reactor.h: gRPC runs one stream's reads one after
// another, and one parse at a time capped a producer far below the link), and
// a cluster member pulls samples from its peers on another, off gRPC's
// callback threads (server/delivery/trainer_service.h).
#ifndef ROLLPACK_BASE_WORKER_POOL_H_
#define ROLLPACK_BASE_WORKER_POOL_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {

class WorkerPool {
 public:
  // At least one thread, whatever `threads` says.
  explicit WorkerPool(int threads);
  // Runs what is queued, then joins the threads.
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Schedule(absl::AnyInvocable<void() &&> work);
  // Work scheduled and not yet started.
  int queued() const;
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Run();

  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace rollpack

#endif  // ROLLPACK_BASE_WORKER_POOL_H_
