#include "server/store/log_replay.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "rollpack/v1/member.pb.h"
#include "rollpack/v1/rollouts.pb.h"
#include "rollpack/v1/scheduler.pb.h"
#include "server/store/convert.h"
#include "server/store/log_records.h"

namespace rollpack {

absl::Status ReplayLog(absl::Span<const LogRecord> records, SampleStore* store) {
  for (size_t i = 0; i < records.size(); ++i) {
    const LogRecord& record = records[i];
    absl::Status s;
    switch (record.type) {
      case RecordType::kRegisterModel: {
        v1::RegisterModelRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("RegisterModel record does not parse");
          break;
        }
        std::optional<PoolOptions> options;
        if (request.has_options()) {
          absl::StatusOr<PoolOptions> parsed = FromProto(request.options());
          if (!parsed.ok()) {
            s = parsed.status();
            break;
          }
          options = *parsed;
        }
        s = store->RegisterModel(request.pool(), FromProto(request.model()), options).status();
        break;
      }
      case RecordType::kPutSamples:
      case RecordType::kPutGroupedSamples:
      case RecordType::kPieceSamples:
      case RecordType::kRaggedSamples: {
        std::string pool;
        std::vector<StoredSample> samples;
        s = DecodeSamples(record.payload, &pool, &samples, record.type);
        if (s.ok()) s = store->Put(pool, std::move(samples)).status();
        break;
      }
      case RecordType::kCreateStep: {
        v1::CreateStepRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("CreateStep record does not parse");
          break;
        }
        absl::StatusOr<Topology> topology = NormalizeTopology(request.topology());
        if (!topology.ok()) {
          s = topology.status();
          break;
        }
        StepRequest step;
        step.step_id = request.step_id();
        step.pool = request.pool();
        step.sample_ids.assign(request.sample_ids().begin(), request.sample_ids().end());
        step.topology = *topology;
        step.reuse_samples = request.reuse_samples();
        step.advantage = AdvantageFromProto(request);
        if (request.replay_source() == v1::REPLAY_SOURCE_RECOMPUTE) {
          step.replay_source = ReplaySourceKind::kRecompute;
        }
        step.replay = true;
        s = store->CreateStep(step).status();
        break;
      }
      case RecordType::kReleaseStep: {
        v1::ReleaseStepRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("ReleaseStep record does not parse");
          break;
        }
        s = store->ReleaseStep(request.step_id()).status();
        break;
      }
      case RecordType::kHoldSamples: {
        v1::HoldSamplesRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("HoldSamples record does not parse");
          break;
        }
        const std::vector<std::string> ids(request.sample_ids().begin(), request.sample_ids().end());
        // Replayed unconfirmed: the member checks it against the cluster's
        // record of steps once it has joined (cluster_steps.h).
        s = store->Hold(request.step_id(), request.pool(), ids, request.coordinator(),
                        request.attempt(), request.reuse_samples(),
                        request.replay_source() == v1::REPLAY_SOURCE_RECOMPUTE);
        break;
      }
      case RecordType::kSetPolicyVersion: {
        v1::SetPolicyVersionRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("SetPolicyVersion record does not parse");
          break;
        }
        s = store->ReplayPolicyVersion(request.pool(), request.policy_version());
        break;
      }
      case RecordType::kDropSamples: {
        v1::DroppedSamplesRecord request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("DropSamples record does not parse");
          break;
        }
        s = store->ReplayDrop(request);
        break;
      }
      case RecordType::kSampleUses: {
        v1::SampleUsesRecord request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("SampleUses record does not parse");
          break;
        }
        s = store->ReplayUses(request);
        break;
      }
      case RecordType::kRecomputeRouting: {
        v1::RecomputeRoutingRecord request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("RecomputeRouting record does not parse");
          break;
        }
        s = store->ReplayRecomputeRouting(request);
        break;
      }
      case RecordType::kAnnotations: {
        v1::AnnotationsRecord request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("Annotations record does not parse");
          break;
        }
        s = store->ReplayAnnotations(request);
        break;
      }
      case RecordType::kDropHold: {
        v1::StepHoldRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("DropHold record does not parse");
          break;
        }
        s = store->DropHold(request.step_id()).status();
        break;
      }
      case RecordType::kDeletePool: {
        v1::DeletePoolRequest request;
        if (!request.ParseFromString(record.payload)) {
          s = absl::DataLossError("DeletePool record does not parse");
          break;
        }
        s = store->DeletePool(request.pool(), /*force=*/true).status();
        break;
      }
      default:
        s = absl::DataLossError("unknown record type");
    }
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat("durable log: replaying record ", i, " (type ",
                                              static_cast<int>(record.type),
                                              ") failed: ", s.ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace rollpack
