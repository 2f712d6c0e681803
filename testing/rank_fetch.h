// Every micro-batch one trainer rank receives for a step, through the
// client library's TrainerStream: what end-to-end tests compare with the
// reference layout (reference_layout.h).
#ifndef ROLLPACK_TESTING_RANK_FETCH_H_
#define ROLLPACK_TESTING_RANK_FETCH_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"
#include "client/cpp/trainer_stream.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

// No resumes: a broken stream is the test's failure, not something to hide.
inline absl::StatusOr<std::vector<v1::Microbatch>> FetchRankMicrobatches(
    const std::string& address, const std::string& step_id, const v1::RankCoords& rank,
    Delivery delivery = Delivery::kAuto) {
  TrainerStreamOptions options;
  options.max_resumes = 0;
  options.delivery = delivery;
  TrainerStream stream(MakeChannel(address), step_id, rank, options);
  std::vector<v1::Microbatch> out;
  while (true) {
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return out;
    out.push_back(**std::move(next));
  }
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_RANK_FETCH_H_
