// Conversions between the wire contract (proto/) and the scheduler's pure C++
// types, with the defaults of layout.md section 1 applied exactly once here.
#ifndef ROLLPACK_SERVER_STORE_CONVERT_H_
#define ROLLPACK_SERVER_STORE_CONVERT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "rollpack/v1/rollouts.pb.h"
#include "rollpack/v1/scheduler.pb.h"
#include "rollpack/v1/trainer.pb.h"
#include "scheduler/advantages.h"
#include "scheduler/layout_scatter.h"
#include "scheduler/model_spec.h"
#include "scheduler/plan.h"
#include "scheduler/sample_selection.h"
#include "scheduler/scheduler_kind.h"
#include "scheduler/topology.h"
#include "server/store/pool_options.h"
#include "server/store/step.h"

namespace rollpack {

ModelSpec FromProto(const v1::ModelSpec& spec);
v1::ModelSpec ToProto(const ModelSpec& spec);

// INVALID_ARGUMENT naming a negative option.
absl::StatusOr<PoolOptions> FromProto(const v1::PoolOptions& options);
v1::PoolOptions ToProto(const PoolOptions& options);

// The sample selection of a CreateStepRequest (its amounts, staleness,
// order); INVALID_ARGUMENT naming a negative amount or bound.
absl::StatusOr<SelectionRequest> SelectionFromProto(const v1::CreateStepRequest& request);

// A CreateStepRequest's advantage, advantage_scalar and advantage_eps
// (lifecycle.md section 6), as given: an estimator value the enum lacks is
// kept for ValidateAdvantageRequest to refuse by name.
AdvantageRequest AdvantageFromProto(const v1::CreateStepRequest& request);
void SetAdvantage(const AdvantageRequest& advantage, v1::CreateStepRequest* request);

// The wire's scheduler enum. ToProto is a switch without default, so a new
// SchedulerKind is a -Wswitch warning there; the way back searches
// kSchedulerKinds for the kind ToProto sends as `kind`, so the two never
// disagree. INVALID_ARGUMENT naming a wire value no kind is sent as.
v1::SchedulerKind ToProto(SchedulerKind kind);
absl::StatusOr<SchedulerKind> SchedulerKindFromProto(v1::SchedulerKind kind);

// Sizes of 0 mean 1; unset sequence_parallel means true;
// microbatch_group_size 0 means pp when vpp > 1, else 1; a cost model with
// both coefficients 0 is derived from hidden_size (6 * h, 1), else the
// default. INVALID_ARGUMENT naming the field for negative values.
absl::StatusOr<Topology> NormalizeTopology(const v1::Topology& topology);
v1::Topology ToProto(const Topology& topology);

v1::PlanStats ToProto(const PlanStats& stats);
// The plan in the operator-readable form of GetPlan (sample ids, not indices).
v1::Plan PlanToProto(const Step& step);
v1::StepInfo StepInfoToProto(const Step& step);

// absl and gRPC share their canonical codes.
grpc::Status ToGrpcStatus(const absl::Status& status);

// An uploaded routing array (R2) read in place: INVALID_ARGUMENT naming the
// step and micro-batch for a dtype other than uint8, uint16, int16, int32 or
// int64 or a rank other than 3. Views `request`'s bytes.
absl::StatusOr<UploadedRouting> ViewRecordedRouting(const v1::RecordedRouting& request);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_CONVERT_H_
