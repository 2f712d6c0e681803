#include "server/ingest/commit_sequencer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace rollpack {

std::shared_ptr<CommitSequencer> CommitSequencer::Create(int stripes) {
  return std::shared_ptr<CommitSequencer>(new CommitSequencer(stripes));
}

// Submit, EndStripe and Abort first take a reference of their own: once the
// lock is released, another thread's Drain may run the done that drops the
// caller's last one while this call still has Drain to run.
void CommitSequencer::Submit(int64_t index, Commit commit, Done done) {
  const std::shared_ptr<CommitSequencer> keep = shared_from_this();
  {
    absl::MutexLock lock(&mu_);
    if (index >= next_ && pending_.count(index) == 0) {
      pending_.emplace(index, Pending{std::move(commit), std::move(done)});
      done = nullptr;
    } else if (ended_.ok()) {
      // A stream that numbers its messages twice: a bug, not a producer error.
      ended_ = absl::InternalError(absl::StrCat("message ", index, " of the call submitted twice"));
    }
  }
  if (done != nullptr) std::move(done)(absl::InternalError("message submitted twice"));
  Drain();
}

void CommitSequencer::EndStripe(int stripe, int64_t count) {
  const std::shared_ptr<CommitSequencer> keep = shared_from_this();
  {
    absl::MutexLock lock(&mu_);
    const int64_t missing = stripe + count * stripes_;
    if (missing < limit_) {
      limit_ = missing;
      limit_reason_ = absl::StrCat("not committed: message ", missing,
                                   " of this call never arrived (stream ", stripe, " of ",
                                   stripes_, " ended after ", count, " messages)");
    }
  }
  Drain();
}

void CommitSequencer::Abort(absl::Status why) {
  const std::shared_ptr<CommitSequencer> keep = shared_from_this();
  {
    absl::MutexLock lock(&mu_);
    if (ended_.ok()) ended_ = std::move(why);
  }
  Drain();
}

absl::Status CommitSequencer::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

std::string CommitSequencer::Refusal(absl::string_view what) const {
  return absl::StrCat(what, " [", committed_samples_, " samples of earlier messages of this ",
                      stripes_ == 1 ? "stream" : absl::StrCat("call (", stripes_, " streams)"),
                      " were committed; this message's were not]");
}

void CommitSequencer::Drain() {
  mu_.Lock();
  if (draining_) {
    mu_.Unlock();
    return;
  }
  draining_ = true;
  while (true) {
    std::vector<std::pair<Done, absl::Status>> dropped;
    if (!ended_.ok()) {
      for (auto& [index, pending] : pending_) dropped.emplace_back(std::move(pending.done), ended_);
      pending_.clear();
    } else {
      for (auto it = pending_.lower_bound(limit_); it != pending_.end(); it = pending_.erase(it)) {
        dropped.emplace_back(std::move(it->second.done), absl::AbortedError(limit_reason_));
      }
    }
    if (!dropped.empty()) {
      mu_.Unlock();
      for (auto& [done, why] : dropped) std::move(done)(why);
      mu_.Lock();
      continue;
    }
    auto next = pending_.begin();
    if (next == pending_.end() || next->first != next_) break;
    Pending message = std::move(next->second);
    pending_.erase(next);
    ++next_;
    mu_.Unlock();
    absl::StatusOr<int64_t> committed = std::move(message.commit)(call_state_);
    absl::Status status;
    mu_.Lock();
    if (committed.ok()) {
      committed_samples_ += *committed;
    } else {
      status = absl::Status(committed.status().code(), Refusal(committed.status().message()));
      if (ended_.ok()) {
        ended_ = absl::AbortedError(absl::StrCat(
            "not committed: an earlier message of this call was refused: ",
            committed.status().message()));
      }
    }
    mu_.Unlock();
    std::move(message.done)(std::move(status));
    mu_.Lock();
  }
  draining_ = false;
  mu_.Unlock();
}

StripedCalls::StripedCalls(absl::Duration join_timeout, int max_waiting)
    : join_timeout_(join_timeout), max_waiting_(max_waiting) {
  const absl::Duration period =
      std::clamp(join_timeout_ / 2, absl::Milliseconds(1), absl::Seconds(10));
  sweeper_ = std::thread([this, period] {
    mu_.Lock();
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) {
      mu_.Unlock();
      Sweep();
      mu_.Lock();
    }
    mu_.Unlock();
  });
}

StripedCalls::~StripedCalls() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sweeper_.join();
}

absl::Status StripedCalls::TimedOut() const {
  return absl::DeadlineExceededError(
      absl::StrCat("striped PutSamples call: not every stream connected within ",
                   absl::FormatDuration(join_timeout_)));
}

void StripedCalls::Sweep() {
  std::vector<std::shared_ptr<CommitSequencer>> timed_out;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = calls_.begin(); it != calls_.end();) {
      Call& call = it->second;
      const bool all_joined = call.until_joined == nullptr;
      if (!call.refusal.ok()) {
        // Long enough for a late stream to be told, then forgotten.
        if (now - call.created > 2 * join_timeout_) {
          it = calls_.erase(it);
          continue;
        }
      } else if (all_joined) {
        if (call.sequencer.expired()) {
          it = calls_.erase(it);
          continue;
        }
      } else if (absl::Status why = call.until_joined->ended(); !why.ok()) {
        // Refused or cancelled before every stream came: its slot is free.
        call.refusal = absl::AbortedError(
            absl::StrCat("striped PutSamples call has ended: ", why.message()));
        call.until_joined.reset();
        --waiting_;
      } else if (now - call.created > join_timeout_) {
        timed_out.push_back(std::move(call.until_joined));
        call.refusal = TimedOut();
        --waiting_;
      }
      ++it;
    }
  }
  // Outside the lock: the dones run the streams' reactors.
  for (auto& stale : timed_out) stale->Abort(TimedOut());
}

absl::StatusOr<std::shared_ptr<CommitSequencer>> StripedCalls::Join(absl::string_view value,
                                                                    int* stripe) {
  const std::vector<absl::string_view> parts = absl::StrSplit(value, '/');
  int index = -1, count = 0;
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(kMetadataKey, " \"", value, "\": ", why,
                                                   " (expected ID/STRIPE/COUNT)"));
  };
  if (parts.size() != 3) return bad("not three fields");
  const absl::string_view id = parts[0];
  if (id.size() < 8 || id.size() > 64) return bad("the id must have 8 to 64 characters");
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
      return bad("the id may hold only [0-9A-Za-z_-]");
    }
  }
  if (!absl::SimpleAtoi(parts[2], &count) || count < 1 || count > CommitSequencer::kMaxStripes) {
    return bad(absl::StrCat("the count must be 1 to ", CommitSequencer::kMaxStripes));
  }
  if (!absl::SimpleAtoi(parts[1], &index) || index < 0 || index >= count) {
    return bad("the stripe must be 0 to COUNT - 1");
  }
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(std::string(id));
  if (it == calls_.end()) {
    if (waiting_ >= max_waiting_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          waiting_, " striped PutSamples calls are waiting for their streams, at most ",
          max_waiting_));
    }
    Call call;
    call.until_joined = CommitSequencer::Create(count);
    call.sequencer = call.until_joined;
    call.stripes = count;
    call.created = absl::Now();
    it = calls_.emplace(std::string(id), std::move(call)).first;
    ++waiting_;
  }
  Call& call = it->second;
  if (!call.refusal.ok()) return call.refusal;
  if (call.stripes != count) return bad(absl::StrCat("the call has ", call.stripes, " streams"));
  if (call.joined & (uint64_t{1} << index)) {
    return bad(absl::StrCat("stream ", index, " of the call already joined"));
  }
  std::shared_ptr<CommitSequencer> sequencer = call.sequencer.lock();
  if (sequencer == nullptr) return bad("the call has ended");
  call.joined |= uint64_t{1} << index;
  if (call.joined == (count == 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1)) {
    call.until_joined.reset();
    --waiting_;
  }
  *stripe = index;
  return sequencer;
}

int StripedCalls::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

}  // namespace rollpack
