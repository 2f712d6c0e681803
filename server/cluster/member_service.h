// gRPC adapter of a member's side of cluster steps (member.proto): what
// the member planning a step asks of the members that hold its samples.
#ifndef ROLLPACK_SERVER_CLUSTER_MEMBER_SERVICE_H_
#define ROLLPACK_SERVER_CLUSTER_MEMBER_SERVICE_H_

#include "absl/functional/any_invocable.h"
#include "base/worker_pool.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "server/cluster/cluster_steps.h"
#include "server/ops/auth.h"
#include "server/store/sample_store.h"
#include "server/store/step_activity.h"

namespace rollpack {

class MemberService final : public v1::Member::CallbackService {
 public:
  // `steps`: this member's cluster steps (R2 stages of its holds). `auth`
  // (may be null: a cluster on a trusted network) admits callers.
  MemberService(SampleStore* store, ClusterSteps* steps, const Authorizer* auth = nullptr)
      : store_(store), steps_(steps), auth_(auth) {}

  grpc::ServerUnaryReactor* ListFreeSamples(grpc::CallbackServerContext* context,
                                            const v1::ListFreeSamplesRequest* request,
                                            v1::FreeSamples* response) override;
  grpc::ServerUnaryReactor* HoldSamples(grpc::CallbackServerContext* context,
                                        const v1::HoldSamplesRequest* request,
                                        v1::HoldSamplesResponse* response) override;
  grpc::ServerUnaryReactor* ConfirmHold(grpc::CallbackServerContext* context,
                                        const v1::StepHoldRequest* request,
                                        v1::ConfirmHoldResponse* response) override;
  grpc::ServerUnaryReactor* DropHold(grpc::CallbackServerContext* context,
                                     const v1::StepHoldRequest* request,
                                     v1::DropHoldResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseHold(grpc::CallbackServerContext* context,
                                        const v1::StepHoldRequest* request,
                                        v1::DropHoldResponse* response) override;
  grpc::ServerUnaryReactor* DropGroups(grpc::CallbackServerContext* context,
                                       const v1::DropGroupsRequest* request,
                                       v1::DropGroupsResponse* response) override;
  grpc::ServerWriteReactor<v1::SampleBatch>* ReadSamples(
      grpc::CallbackServerContext* context, const v1::ReadSamplesRequest* request) override;
  grpc::ServerUnaryReactor* StageRouting(grpc::CallbackServerContext* context,
                                         const v1::StageRoutingRequest* request,
                                         v1::UploadRoutingResponse* response) override;
  grpc::ServerUnaryReactor* CheckRouting(grpc::CallbackServerContext* context,
                                         const v1::MemberRoutingRequest* request,
                                         v1::CommitRoutingResponse* response) override;
  grpc::ServerUnaryReactor* CommitRouting(grpc::CallbackServerContext* context,
                                          const v1::MemberRoutingRequest* request,
                                          v1::CommitRoutingResponse* response) override;
  // AnnotateSamples' two phases (cluster_annotations.h) on this member's
  // share: SampleStore::PrepareAnnotations, CommitAnnotations, AbortAnnotations.
  grpc::ServerUnaryReactor* PrepareAnnotations(grpc::CallbackServerContext* context,
                                               const v1::PrepareAnnotationsRequest* request,
                                               v1::PrepareAnnotationsResponse* response) override;
  grpc::ServerUnaryReactor* CommitAnnotations(grpc::CallbackServerContext* context,
                                              const v1::AnnotationTicketRequest* request,
                                              v1::CommitAnnotationsResponse* response) override;
  grpc::ServerUnaryReactor* AbortAnnotations(grpc::CallbackServerContext* context,
                                             const v1::AnnotationTicketRequest* request,
                                             v1::PrepareAnnotationsResponse* response) override;
  // This member's line of the cluster status (member_status.h), its drain
  // key read again first when asked.
  grpc::ServerUnaryReactor* LocalStatus(grpc::CallbackServerContext* context,
                                        const v1::LocalStatusRequest* request,
                                        v1::ClusterMemberStatus* response) override;
  // This member's trainer streams of steps (--step-ttl over a cluster).
  grpc::ServerUnaryReactor* StepStreams(grpc::CallbackServerContext* context,
                                        const v1::StepStreamsRequest* request,
                                        v1::StepStreamsResponse* response) override;
  // Where StepStreams reads (set before serving; none: every step is "never
  // streamed here").
  void AttachActivity(StepActivity* activity) { activity_ = activity; }

 private:
  // Runs `work` on routing_calls_ and finishes the call with its status.
  grpc::ServerUnaryReactor* OffThread(grpc::CallbackServerContext* context,
                                      absl::AnyInvocable<absl::Status() &&> work);

  SampleStore* const store_;
  ClusterSteps* const steps_;
  const Authorizer* const auth_;
  StepActivity* activity_ = nullptr;
  WorkerPool routing_calls_{4};
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_MEMBER_SERVICE_H_
