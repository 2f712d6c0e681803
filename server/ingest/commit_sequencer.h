// Commits the request messages of one PutSamples call in the order the
// producer sent them, whether the call is one stream or is striped over
// several: a producer may spread one call's messages over a few connections,
// because one HTTP/2 connection carries well under half of what loopback
// TCP does (docs/performance.md). Message m of a call striped over C streams
// travels on stream m % C, as that stream's message m / C.
//
// Messages are parsed and validated in any order, on any thread; their
// commits run here one at a time, in message order, so the store's arrival
// order (what CreateStep takes first) never depends on which connection was
// faster. The first refused commit ends the call: no later message is
// committed.
#ifndef ROLLPACK_SERVER_INGEST_COMMIT_SEQUENCER_H_
#define ROLLPACK_SERVER_INGEST_COMMIT_SEQUENCER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

class CommitSequencer : public std::enable_shared_from_this<CommitSequencer> {
 public:
  // What the commits of one call share, whatever stream carried them; only
  // commits touch it, and they run one at a time, in message order.
  struct CallState {
    // The pool of the latest message that named one: a message without a
    // pool goes to the pool of the message before it in the call.
    std::string pool;
  };
  // Commits one message; returns the samples it stored or why it was refused.
  using Commit = absl::AnyInvocable<absl::StatusOr<int64_t>(CallState&) &&>;
  // Runs exactly once per submitted message, after its commit (OK or the
  // refusal) or instead of it (why it was not committed). It is the last
  // thing the sequencer does with the message.
  using Done = absl::AnyInvocable<void(absl::Status) &&>;

  // A call of `stripes` streams (1 to kMaxStripes).
  static std::shared_ptr<CommitSequencer> Create(int stripes = 1);
  static constexpr int kMaxStripes = 64;

  int stripes() const { return stripes_; }

  // Message `index` of the call is ready. Its commit and done, and those of
  // later messages waiting for it, run on this thread before Submit returns,
  // unless another thread is committing for this call: then that thread runs
  // them. No lock of the caller may be held.
  void Submit(int64_t index, Commit commit, Done done);

  // Stream `stripe` has delivered all its messages, `count` of them: a
  // message it would have carried next is never coming, and no message after
  // that one can be committed either.
  void EndStripe(int stripe, int64_t count);

  // Ends the call: messages not committed yet never are; their done gets
  // `why`.
  void Abort(absl::Status why);

  // Why the call ended (a refusal or Abort), or OK while it goes on.
  absl::Status ended() const;

 private:
  struct Pending {
    Commit commit;
    Done done;
  };

  explicit CommitSequencer(int stripes) : stripes_(stripes) {}
  // Runs what is ready: one thread at a time (`draining_`), others only queue.
  void Drain();
  std::string Refusal(absl::string_view what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int stripes_;
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  // The first message that can never come (EndStripe): later ones are dropped.
  int64_t limit_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  std::string limit_reason_ ABSL_GUARDED_BY(mu_);
  // Set by the first refusal or Abort; every later message is dropped with it.
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
  int64_t committed_samples_ ABSL_GUARDED_BY(mu_) = 0;
  // Only the draining thread touches it, with mu_ released.
  CallState call_state_;
};

// The striped calls being served: the streams of one call find their shared
// sequencer by the call's id, which the producer sends on every stream as
// `rollpack-stripe: ID/STRIPE/COUNT` metadata (ID: 8 to 64 characters of
// [0-9A-Za-z_-], fresh for each call). Thread-safe.
class StripedCalls {
 public:
  static constexpr char kMetadataKey[] = "rollpack-stripe";
  // A call whose streams have not all arrived after `join_timeout` is
  // aborted (DEADLINE_EXCEEDED), by a thread of this object that looks every
  // half timeout (at most every 10 s); a stream of it that arrives later, up
  // to another timeout on, is refused with the same status.
  explicit StripedCalls(absl::Duration join_timeout = absl::Minutes(5), int max_waiting = 4096);
  ~StripedCalls();

  StripedCalls(const StripedCalls&) = delete;
  StripedCalls& operator=(const StripedCalls&) = delete;

  // The sequencer of the call `value` (the metadata value) names, joined as
  // its stripe. INVALID_ARGUMENT for a malformed value, a count that differs
  // from the call's or a stripe that already joined; DEADLINE_EXCEEDED for a
  // call aborted because its streams did not all arrive; RESOURCE_EXHAUSTED
  // past max_waiting calls waiting for their streams.
  absl::StatusOr<std::shared_ptr<CommitSequencer>> Join(absl::string_view value, int* stripe);

  // Calls still waiting for some of their streams (for tests).
  int waiting() const;

 private:
  struct Call {
    // Held until every stream has joined: a stream that finishes before a
    // later one arrives must not take the call's state with it.
    std::shared_ptr<CommitSequencer> until_joined;
    std::weak_ptr<CommitSequencer> sequencer;
    int stripes = 0;
    uint64_t joined = 0;  // bit s: stripe s joined
    absl::Time created;
    // Set when the call timed out or ended before all its streams joined:
    // the entry stays, so that a late stream is refused with this rather
    // than starting a call of its own.
    absl::Status refusal;
  };

  // Aborts the calls past their join timeout, stops waiting for the streams
  // of calls that have ended, and forgets both after a while.
  void Sweep();
  absl::Status TimedOut() const;

  const absl::Duration join_timeout_;
  const int max_waiting_;
  mutable absl::Mutex mu_;
  std::map<std::string, Call> calls_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_COMMIT_SEQUENCER_H_
