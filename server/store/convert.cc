#include "server/store/convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/store/names.h"
#include "server/store/ndarray.h"

namespace rollpack {

ModelSpec FromProto(const v1::ModelSpec& spec) {
  ModelSpec out;
  out.name = spec.name();
  out.num_layers = spec.num_layers();
  out.moe_layers.assign(spec.moe_layers().begin(), spec.moe_layers().end());
  out.num_experts = spec.num_experts();
  out.topk = spec.topk();
  out.allow_all_zero_layers = spec.allow_all_zero_layers();
  out.finite_token_fields.assign(spec.finite_token_fields().begin(),
                                 spec.finite_token_fields().end());
  out.num_mtp_layers = spec.num_mtp_layers();
  out.mtp_routing = spec.mtp_routing();
  out.vocab_size = spec.vocab_size();
  return out;
}

v1::ModelSpec ToProto(const ModelSpec& spec) {
  v1::ModelSpec out;
  out.set_name(spec.name);
  out.set_num_layers(spec.num_layers);
  out.mutable_moe_layers()->Assign(spec.moe_layers.begin(), spec.moe_layers.end());
  out.set_num_experts(spec.num_experts);
  out.set_topk(spec.topk);
  out.set_allow_all_zero_layers(spec.allow_all_zero_layers);
  for (const std::string& field : spec.finite_token_fields) out.add_finite_token_fields(field);
  // proto3 leaves zero fields out: a model without MTP layers encodes (in
  // the durable log, in etcd) exactly as before they existed.
  out.set_num_mtp_layers(spec.num_mtp_layers);
  out.set_mtp_routing(spec.mtp_routing);
  out.set_vocab_size(spec.vocab_size);
  return out;
}

absl::StatusOr<Topology> NormalizeTopology(const v1::Topology& in) {
  Topology t;
  auto size = [](const char* field, int64_t value, auto* out) -> absl::Status {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology: ", field, " is ", value, ", must not be negative"));
    }
    *out = value == 0 ? 1 : value;
    return absl::OkStatus();
  };
  for (auto [field, value, out] :
       {std::tuple<const char*, int64_t, int*>{"dp", in.dp(), &t.dp},
        {"cp", in.cp(), &t.cp},
        {"tp", in.tp(), &t.tp},
        {"pp", in.pp(), &t.pp},
        {"vpp", in.vpp(), &t.vpp},
        {"pad_multiple", in.pad_multiple(), &t.pad_multiple},
        {"min_cp", in.min_cp(), &t.min_cp}}) {
    RETURN_IF_ERROR(size(field, value, out));
  }
  if (in.num_layers_in_first_pipeline_stage() < 0 || in.num_layers_in_last_pipeline_stage() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: num_layers_in_first_pipeline_stage ", in.num_layers_in_first_pipeline_stage(),
        " and num_layers_in_last_pipeline_stage ", in.num_layers_in_last_pipeline_stage(),
        " must not be negative"));
  }
  t.num_layers_in_first_pipeline_stage = in.num_layers_in_first_pipeline_stage();
  t.num_layers_in_last_pipeline_stage = in.num_layers_in_last_pipeline_stage();
  t.sequence_parallel = in.has_sequence_parallel() ? in.sequence_parallel() : true;
  if (in.max_tokens_per_rank() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: max_tokens_per_rank is ", in.max_tokens_per_rank(), ", must be set (>= 1)"));
  }
  t.max_tokens_per_rank = in.max_tokens_per_rank();
  if (in.microbatch_group_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: microbatch_group_size is ", in.microbatch_group_size(), ", must not be negative"));
  }
  t.microbatch_group_size = in.microbatch_group_size() > 0 ? in.microbatch_group_size()
                            : t.vpp > 1                    ? t.pp
                                                           : 1;
  ASSIGN_OR_RETURN(t.scheduler, SchedulerKindFromProto(in.scheduler()));
  const v1::CostModel& cost = in.cost();
  if (cost.linear() < 0 || cost.quadratic() < 0 || cost.hidden_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: cost linear ", cost.linear(), ", quadratic ", cost.quadratic(),
        ", hidden_size ", cost.hidden_size(), " must not be negative"));
  }
  if (cost.linear() > 0 || cost.quadratic() > 0) {
    t.cost.linear = cost.linear();
    t.cost.quadratic = cost.quadratic();
  } else if (cost.hidden_size() > 0) {
    t.cost.linear = 6.0 * static_cast<double>(cost.hidden_size());
    t.cost.quadratic = 1.0;
  }
  return t;
}

v1::SchedulerKind ToProto(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::kStaticCp:
      return v1::STATIC_CP;
    case SchedulerKind::kDynamicCp:
      return v1::DYNAMIC_CP;
  }
  return v1::STATIC_CP;  // not reached: every kind has its case
}

absl::StatusOr<SchedulerKind> SchedulerKindFromProto(v1::SchedulerKind kind) {
  for (const SchedulerKindTraits& row : kSchedulerKinds) {
    if (ToProto(row.kind) == kind) return row.kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("topology: unknown scheduler ", static_cast<int>(kind)));
}

v1::Topology ToProto(const Topology& t) {
  v1::Topology out;
  out.set_dp(t.dp);
  out.set_cp(t.cp);
  out.set_tp(t.tp);
  out.set_pp(t.pp);
  out.set_vpp(t.vpp);
  out.set_sequence_parallel(t.sequence_parallel);
  out.set_num_layers_in_first_pipeline_stage(t.num_layers_in_first_pipeline_stage);
  out.set_num_layers_in_last_pipeline_stage(t.num_layers_in_last_pipeline_stage);
  out.set_max_tokens_per_rank(t.max_tokens_per_rank);
  out.set_pad_multiple(t.pad_multiple);
  out.set_microbatch_group_size(t.microbatch_group_size);
  out.set_scheduler(ToProto(t.scheduler));
  out.set_min_cp(t.min_cp);
  out.mutable_cost()->set_linear(t.cost.linear);
  out.mutable_cost()->set_quadratic(t.cost.quadratic);
  return out;
}

v1::PlanStats ToProto(const PlanStats& s) {
  v1::PlanStats out;
  out.set_num_microbatches(s.num_microbatches);
  out.set_min_microbatches(s.min_microbatches);
  out.set_rank_imbalance(s.rank_imbalance);
  out.set_sync(s.sync);
  out.set_peak(s.peak);
  out.set_padding_overhead(s.padding_overhead);
  out.set_plan_ms(s.plan_ms);
  out.set_num_tokens(s.num_tokens);
  out.set_num_padded_tokens(s.num_padded_tokens);
  return out;
}

v1::Plan PlanToProto(const Step& step) {
  v1::Plan out;
  out.set_step_id(step.step_id);
  out.set_pool(step.pool);
  *out.mutable_topology() = ToProto(step.topology);
  *out.mutable_stats() = ToProto(step.plan.stats);
  for (size_t m = 0; m < step.plan.microbatches.size(); ++m) {
    v1::PlanMicrobatch* mb = out.add_microbatches();
    mb->set_index(static_cast<int>(m));
    for (const PlanGroup& group : step.plan.microbatches[m].groups) {
      v1::RankGroup* g = mb->add_groups();
      g->set_first_rank(group.first_rank);
      g->set_cp_size(group.cp_size);
      for (int seq : group.sequences) g->add_sample_ids(step.sample_ids[seq]);
      g->mutable_padded_lengths()->Assign(group.padded_lengths.begin(), group.padded_lengths.end());
      g->set_workload(group.work_per_rank);
      g->set_tokens_per_rank(group.tokens_per_rank);
    }
  }
  return out;
}

v1::StepInfo StepInfoToProto(const Step& step) {
  v1::StepInfo out;
  out.set_step_id(step.step_id);
  out.set_pool(step.pool);
  out.set_num_samples(static_cast<int>(step.sample_ids.size()));
  out.set_num_microbatches(static_cast<int>(step.plan.microbatches.size()));
  *out.mutable_topology() = ToProto(step.topology);
  *out.mutable_stats() = ToProto(step.plan.stats);
  out.set_num_tokens(step.plan.stats.num_tokens);
  out.set_num_groups(step.num_groups);
  out.set_reuse_samples(step.reuse_samples);
  if (step.replay.source == ReplaySourceKind::kRecompute) {
    out.set_replay_source(v1::REPLAY_SOURCE_RECOMPUTE);
  }
  out.set_advantage(static_cast<v1::AdvantageEstimator>(step.metadata.advantage.estimator));
  out.set_advantage_scalar(step.metadata.advantage.scalar);
  for (const PipelineStage& stage : step.layout.pipeline().stages()) {
    v1::PipelineStageLayers* s = out.add_stage_layers();
    s->set_pp_rank(stage.pp_rank);
    s->mutable_layers()->Assign(stage.layers.begin(), stage.layers.end());
    s->mutable_replay_layers()->Assign(stage.replay_layers.begin(), stage.replay_layers.end());
  }
  return out;
}

absl::StatusOr<PoolOptions> FromProto(const v1::PoolOptions& options) {
  auto negative = [](absl::string_view field, int64_t value) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.", field, " is ", value, ", must be >= 0"));
  };
  if (options.default_group_size() < 0) {
    return negative("default_group_size", options.default_group_size());
  }
  if (options.has_max_staleness() && options.max_staleness() < 0) {
    return negative("max_staleness", options.max_staleness());
  }
  if (options.max_uses() < 0) return negative("max_uses", options.max_uses());
  if (options.incomplete_group_timeout_ms() < 0) {
    return negative("incomplete_group_timeout_ms", options.incomplete_group_timeout_ms());
  }
  if (options.drop_stale() && !options.has_max_staleness()) {
    return absl::InvalidArgumentError(
        "options.drop_stale needs options.max_staleness (which samples are stale)");
  }
  PoolOptions out;
  out.default_group_size = options.default_group_size();
  if (options.has_max_staleness()) out.max_staleness = options.max_staleness();
  out.drop_stale = options.drop_stale();
  out.max_uses = options.max_uses();
  out.incomplete_group_timeout_ms = options.incomplete_group_timeout_ms();
  for (const v1::TokenFieldSchema& field : options.token_fields()) {
    const std::string what = absl::StrCat("options.token_fields[\"", field.name(), "\"]");
    if (field.name().empty()) {
      return absl::InvalidArgumentError("options.token_fields has an entry without a name");
    }
    RETURN_IF_ERROR(
        ValidateName("options.token_fields name", field.name(), kMaxTokenFieldNameBytes));
    if (out.FindTokenField(field.name()) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is declared twice"));
    }
    if (field.dtype() == v1::FLOAT64 || DTypeSize(field.dtype()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ".dtype is ", DTypeName(field.dtype()),
          "; a pool stores uint8, uint16, int16, int32, int64, float16, bfloat16 or float32"));
    }
    if (field.allow_narrowing() && field.dtype() != v1::FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ".allow_narrowing is for float32 fields (float64 input), this one is ",
          DTypeName(field.dtype())));
    }
    if (field.trailing_shape_size() > kMaxTokenFieldTrailingDims) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".trailing_shape has ",
                                                     field.trailing_shape_size(), " dimensions, at most ",
                                                     kMaxTokenFieldTrailingDims));
    }
    for (int64_t d : field.trailing_shape()) {
      if (d < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ".trailing_shape has dimension ", d, ", must be >= 1"));
      }
    }
    out.token_fields.push_back(DeclaredTokenField{
        field.name(), field.dtype(),
        std::vector<int64_t>(field.trailing_shape().begin(), field.trailing_shape().end()),
        field.allow_narrowing()});
  }
  std::sort(out.token_fields.begin(), out.token_fields.end(),
            [](const DeclaredTokenField& a, const DeclaredTokenField& b) { return a.name < b.name; });
  // Sorted, so the same names in another order are the same options.
  for (const std::string& name : options.required_scalars()) {
    if (name.empty()) {
      return absl::InvalidArgumentError("options.required_scalars has an empty name");
    }
    RETURN_IF_ERROR(ValidateName("options.required_scalars name", name, kMaxScalarNameBytes));
    if (std::find(out.required_scalars.begin(), out.required_scalars.end(), name) !=
        out.required_scalars.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("options.required_scalars names \"", name, "\" twice"));
    }
    out.required_scalars.push_back(name);
  }
  std::sort(out.required_scalars.begin(), out.required_scalars.end());
  return out;
}

v1::PoolOptions ToProto(const PoolOptions& options) {
  v1::PoolOptions out;
  out.set_default_group_size(options.default_group_size);
  if (options.max_staleness.has_value()) out.set_max_staleness(*options.max_staleness);
  out.set_drop_stale(options.drop_stale);
  out.set_max_uses(options.max_uses);
  out.set_incomplete_group_timeout_ms(options.incomplete_group_timeout_ms);
  for (const DeclaredTokenField& field : options.token_fields) {
    v1::TokenFieldSchema* f = out.add_token_fields();
    f->set_name(field.name);
    f->set_dtype(field.dtype);
    f->mutable_trailing_shape()->Assign(field.trailing_shape.begin(), field.trailing_shape.end());
    f->set_allow_narrowing(field.allow_narrowing);
  }
  for (const std::string& name : options.required_scalars) out.add_required_scalars(name);
  return out;
}

absl::StatusOr<SelectionRequest> SelectionFromProto(const v1::CreateStepRequest& request) {
  const std::string who = absl::StrCat("step \"", request.step_id(), "\": ");
  auto negative = [&](absl::string_view field, int64_t value) {
    return absl::InvalidArgumentError(absl::StrCat(who, field, " is ", value, ", must be >= 0"));
  };
  if (request.num_samples() < 0) return negative("num_samples", request.num_samples());
  if (request.num_groups() < 0) return negative("num_groups", request.num_groups());
  if (request.num_tokens() < 0) return negative("num_tokens", request.num_tokens());
  if (request.policy_version() < 0) return negative("policy_version", request.policy_version());
  if (request.has_max_staleness() && request.max_staleness() < 0) {
    return negative("max_staleness", request.max_staleness());
  }
  if (request.selection() != v1::OLDEST && request.selection() != v1::NEWEST_VERSION) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "selection ", static_cast<int>(request.selection()), " is not a SampleSelection"));
  }
  SelectionRequest out;
  out.num_samples = request.num_samples();
  out.num_groups = request.num_groups();
  out.num_tokens = request.num_tokens();
  out.whole_groups = request.whole_groups();
  out.policy_version = request.policy_version();
  if (request.has_max_staleness()) out.max_staleness = request.max_staleness();
  out.order = request.selection() == v1::NEWEST_VERSION ? SelectionOrder::kNewestVersion
                                                         : SelectionOrder::kOldest;
  return out;
}

AdvantageRequest AdvantageFromProto(const v1::CreateStepRequest& request) {
  AdvantageRequest out;
  out.estimator = static_cast<AdvantageEstimator>(request.advantage());
  out.scalar = request.advantage_scalar();
  out.eps = request.advantage_eps();
  return out;
}

void SetAdvantage(const AdvantageRequest& advantage, v1::CreateStepRequest* request) {
  request->set_advantage(static_cast<v1::AdvantageEstimator>(advantage.estimator));
  request->set_advantage_scalar(advantage.scalar);
  request->set_advantage_eps(advantage.eps);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::StatusOr<UploadedRouting> ViewRecordedRouting(const v1::RecordedRouting& request) {
  const std::string what = absl::StrCat("step \"", request.step_id(), "\" micro-batch ",
                                        request.index(), ": recorded routing");
  ASSIGN_OR_RETURN(ArrayView view, ViewArray(request.experts(), what));
  bool is_signed = false;
  switch (view.dtype) {
    case v1::UINT8:
    case v1::UINT16:
      break;
    case v1::INT16:
    case v1::INT32:
    case v1::INT64:
      is_signed = true;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has dtype ", DTypeName(view.dtype),
          "; expected uint8, uint16, int16, int32 or int64 expert ids"));
  }
  if (view.rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", view.rank(), " dimensions; expected [router_rows, replay layers, topk]"));
  }
  UploadedRouting upload;
  upload.data = reinterpret_cast<const uint8_t*>(view.data.data());
  upload.size_bytes = static_cast<int64_t>(view.data.size());
  upload.element_bytes = DTypeSize(view.dtype);
  upload.is_signed = is_signed;
  upload.rows = view.dim(0);
  upload.layers = view.dim(1);
  upload.topk = view.dim(2);
  return upload;
}


}  // namespace rollpack
