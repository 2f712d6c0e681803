// What a micro-batch says about each of its sequences (lifecycle.md section
// 6): group ids, policy versions, scalars and advantages, one value per
// sequence in the order of sample_ids, on every rank.
//
// They come from the network, so they are checked against the micro-batch's
// own number of sequences before anything reads them: a server that sent a
// scalar of another dtype or length would otherwise hand a trainer rewards
// of the wrong sequences. Both message forms hold these fields whole in
// their metadata (ReceivedMicrobatch parses them with the small fields), so
// the functions take a v1::Microbatch.
#ifndef ROLLPACK_CLIENT_CPP_SEQUENCE_METADATA_H_
#define ROLLPACK_CLIENT_CPP_SEQUENCE_METADATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

// The per-sequence fields of one micro-batch, decoded. S = sample_ids size.
struct SequenceMetadata {
  // False when the micro-batch has sequences but no group ids and policy
  // versions: a rollpackd older than lifecycle.md section 6 sent it (the
  // vectors are then empty). True otherwise, with S entries each.
  bool sent = false;
  std::vector<std::string> group_ids;  // "" = an ungrouped sample
  std::vector<int64_t> policy_versions;
  // Scalars every sample of the step has, S values each.
  std::map<std::string, std::vector<double>> scalars;
  // Set when the step has an advantage estimator: S values.
  bool has_advantages = false;
  std::vector<float> advantages;
};

// OK when the fields fit the micro-batch: group_ids and policy_versions both
// of S entries (or, from an older server, both empty); every scalar FLOAT64
// [S] with 8 * S bytes; advantages unset or FLOAT32 [S] with 4 * S bytes.
// Otherwise DATA_LOSS naming the micro-batch, the field and what it holds,
// e.g. `micro-batch 3 of step "s7": scalars["reward"] is FLOAT32 [4] (16
// bytes), not FLOAT64 [4] (32 bytes): one value per sequence`.
absl::Status CheckSequenceMetadata(const v1::Microbatch& m);

// The fields, checked (CheckSequenceMetadata) and decoded (little-endian).
absl::StatusOr<SequenceMetadata> ReadSequenceMetadata(const v1::Microbatch& m);

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_SEQUENCE_METADATA_H_
