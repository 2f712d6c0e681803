#include "base/worker_pool.h"

#include <algorithm>
#include <utility>

namespace rollpack {

WorkerPool::WorkerPool(int threads) {
  threads = std::max(threads, 1);
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Schedule(absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&mu_);
  // Work queued while the destructor drains still runs (it is only queued
  // from work already running, or from gRPC before the server stopped).
  queue_.push_back(std::move(work));
}

void WorkerPool::Run() {
  while (true) {
    absl::AnyInvocable<void() &&> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mu_) {
            return pool->stopping_ || !pool->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(work)();
  }
}

int WorkerPool::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

}  // namespace rollpack
