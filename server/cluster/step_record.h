// A cluster step's record (member.proto ClusterStepRecord) as every member
// reads it back from etcd, where anyone who reaches etcd without credentials
// could have written it (docs/cluster.md, "Threat model"): checked whole
// before a plan is made from it, so a member never indexes, sizes or
// gathers by an unchecked field.
#ifndef ROLLPACK_SERVER_CLUSTER_STEP_RECORD_H_
#define ROLLPACK_SERVER_CLUSTER_STEP_RECORD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rollpack/v1/member.pb.h"
#include "server/store/step.h"

namespace rollpack {

// The step `step_id` (the etcd key's name) planned from `record`: the plan
// and layout every member derives alike, its `samples` empty (the bytes stay
// on their owners). DATA_LOSS naming the step and the field for a record that
// is not one a planner writes: another step's id, counts that disagree,
// a non-positive length, an owner that is not a listed member, a member that
// is not a host:port, per-sequence metadata RecordMetadata refuses, or a
// record that no longer plans on its topology.
absl::StatusOr<std::shared_ptr<const Step>> StepFromRecord(const std::string& step_id,
                                                           const v1::ClusterStepRecord& record);

// The planner's side: `metadata` into the record's fields 15-19.
void SetRecordMetadata(const StepMetadata& metadata, v1::ClusterStepRecord* record);
// Every member's side: the step's per-sequence metadata as the record says,
// so every member encodes the same bytes (and a member that reads the
// record again after a restart, too). DATA_LOSS naming the step and the
// field unless: group_ids and policy_versions have one entry per sample
// (or both none: a record of a planner older than lifecycle.md section 6,
// which then carries no scalar or advantage either); every scalar has a
// non-empty name, used once, and one value per sample; the advantage is one of AdvantageEstimator's; advantages has
// one finite value per sample with an estimator, none without.
absl::StatusOr<StepMetadata> RecordMetadata(const std::string& step_id,
                                            const v1::ClusterStepRecord& record);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_STEP_RECORD_H_
