// Multi-turn sessions on the capture port (shared/spec/capture.md section
// 6): one sample per session, a piece per turn. What a session has stored
// lives in the store (an open sample, durable like any piece), so a session
// survives a restart; this only keeps which sessions have a turn in flight.
#ifndef ROLLPACK_SERVER_CAPTURE_CAPTURE_SESSIONS_H_
#define ROLLPACK_SERVER_CAPTURE_CAPTURE_SESSIONS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/store/sample_store.h"

namespace rollpack {

class CaptureSessions;

// A turn of a session admitted to capture: the session is "in flight"
// until this is destroyed, whatever becomes of the turn.
class SessionTurn {
 public:
  ~SessionTurn();
  SessionTurn(const SessionTurn&) = delete;
  SessionTurn& operator=(const SessionTurn&) = delete;

  const std::string& pool() const { return pool_; }
  const std::string& session() const { return session_; }
  // The piece this turn stores, and the tokens stored before it.
  int32_t piece() const { return piece_; }
  const std::vector<int32_t>& stored_tokens() const { return stored_tokens_; }
  // The first routing row not yet stored: what the engine is asked from.
  int64_t start_offset() const { return start_offset_; }
  // The open sample's token fields (a sealing piece without tokens carries
  // them empty) and scalars; empty for a first turn.
  const std::map<std::string, FieldSchema>& token_fields() const { return token_fields_; }
  const std::map<std::string, double>& scalars() const { return scalars_; }

 private:
  friend class CaptureSessions;
  SessionTurn(CaptureSessions* sessions, std::string pool, std::string session)
      : sessions_(sessions), pool_(std::move(pool)), session_(std::move(session)) {}

  CaptureSessions* const sessions_;
  const std::string pool_;
  const std::string session_;
  int32_t piece_ = 0;
  std::vector<int32_t> stored_tokens_;
  int64_t start_offset_ = 0;
  std::map<std::string, FieldSchema> token_fields_;
  std::map<std::string, double> scalars_;
};

class CaptureSessions {
 public:
  explicit CaptureSessions(SampleStore* store) : store_(store) {}

  // Admits a turn of `session` in `pool`. FAILED_PRECONDITION naming the
  // session when a turn of it is in flight or it is sealed; the store's
  // error when the pool cannot be read.
  absl::StatusOr<std::unique_ptr<SessionTurn>> Begin(const std::string& pool,
                                                     const std::string& session);

  // The first position where `prompt` leaves `stored` (the harness rewrote
  // or truncated the history), or nullopt when it starts with all of it.
  static std::optional<int64_t> PromptDiffers(absl::Span<const int32_t> stored,
                                              absl::Span<const int32_t> prompt);

 private:
  friend class SessionTurn;
  void End(const std::string& pool, const std::string& session);

  SampleStore* const store_;
  absl::Mutex mu_;
  absl::flat_hash_set<std::pair<std::string, std::string>> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_CAPTURE_SESSIONS_H_
