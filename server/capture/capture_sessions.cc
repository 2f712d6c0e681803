#include "server/capture/capture_sessions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rollpack {

SessionTurn::~SessionTurn() { sessions_->End(pool_, session_); }

absl::StatusOr<std::unique_ptr<SessionTurn>> CaptureSessions::Begin(const std::string& pool,
                                                                    const std::string& session) {
  {
    absl::MutexLock lock(&mu_);
    if (!in_flight_.emplace(pool, session).second) {
      return absl::FailedPreconditionError(
          absl::StrCat("session ", session, ": a turn is in flight"));
    }
  }
  // From here the turn owns the in-flight mark: every return releases it.
  std::unique_ptr<SessionTurn> turn(new SessionTurn(this, pool, session));
  absl::StatusOr<SampleStore::OpenSampleState> open = store_->GetOpenSample(pool, session);
  if (open.ok()) {
    turn->piece_ = open->pieces;
    turn->stored_tokens_ = std::move(open->tokens);
    turn->start_offset_ = std::max<int64_t>(open->rows_end, 0);
    turn->token_fields_ = std::move(open->token_fields);
    turn->scalars_ = std::move(open->scalars);
    return turn;
  }
  if (open.status().code() == absl::StatusCode::kFailedPrecondition) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session, " is sealed"));
  }
  // Its first turn; a pool this member has not adopted yet (cluster mode)
  // or that is not registered is found out when the turn is stored.
  if (open.status().code() == absl::StatusCode::kNotFound) return turn;
  return open.status();
}

void CaptureSessions::End(const std::string& pool, const std::string& session) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(std::make_pair(pool, session));
}

std::optional<int64_t> CaptureSessions::PromptDiffers(absl::Span<const int32_t> stored,
                                                      absl::Span<const int32_t> prompt) {
  const size_t common = std::min(stored.size(), prompt.size());
  for (size_t i = 0; i < common; ++i) {
    if (stored[i] != prompt[i]) return static_cast<int64_t>(i);
  }
  if (prompt.size() < stored.size()) return static_cast<int64_t>(prompt.size());
  return std::nullopt;
}

}  // namespace rollpack
