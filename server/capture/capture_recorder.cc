#include "server/capture/capture_recorder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "server/capture/captured_sample.h"
#include "server/ingest/sample_validation.h"

namespace rollpack {
namespace {

// Section 2: B, then the id, group and group size of choices
// [first, first + count) of `total` (only those: `total` comes from the
// client's n).
std::vector<CapturedIdentity> Identities(const CapturedRequest& request, int64_t first,
                                         size_t count, int64_t total,
                                         const std::string& base_id) {
  const CaptureHeaders& headers = request.headers;
  const size_t choices = static_cast<size_t>(total);
  // A batch of prompts (SGLang /generate with a list) is ungrouped; n > 1
  // choices of one prompt are a GRPO group.
  const bool batch = request.forwarded.batch_size > 1;
  const bool grouped = choices > 1 && !batch;
  std::vector<CapturedIdentity> identities(count);
  for (size_t i = 0; i < count; ++i) {
    CapturedIdentity& identity = identities[i];
    identity.sample_id =
        choices == 1 ? base_id : absl::StrCat(base_id, "#", first + static_cast<int64_t>(i));
    if (headers.group_id.has_value()) {
      identity.group_id = *headers.group_id;
    } else if (grouped) {
      identity.group_id = base_id;
    }
    if (headers.group_size.has_value()) {
      identity.group_size = *headers.group_size;
    } else if (grouped && !headers.group_id.has_value()) {
      identity.group_size = static_cast<int32_t>(choices);
    }
    identity.policy_version = headers.policy_version;
    if (headers.scalars.has_value()) identity.scalars = *headers.scalars;
  }
  if (request.turn != nullptr && choices == 1) {
    // A session's turn: the next piece of the session's one sample.
    CapturedIdentity& identity = identities[0];
    identity.sample_id = request.turn->session();
    identity.piece = request.turn->piece();
    identity.partial = !headers.final_turn;
    identity.stored_tokens = static_cast<int64_t>(request.turn->stored_tokens().size());
  }
  return identities;
}

}  // namespace

CaptureRecorder::CaptureRecorder(SampleStore* store, ServerMetrics* metrics, Engine engine,
                                 std::string default_pool, bool keep_routing)
    : store_(store),
      metrics_(metrics),
      engine_(engine),
      default_pool_(std::move(default_pool)),
      keep_routing_(keep_routing),
      sessions_(store) {}

CaptureOutcome CaptureRecorder::Record(const CapturedRequest& request,
                                       absl::string_view body) const {
  CaptureOutcome outcome;
  outcome.pool = request.headers.pool.value_or(default_pool_);
  absl::StatusOr<EngineResponse> response =
      ParseEngineResponse(request.endpoint, request.forwarded, body, keep_routing_);
  if (!response.ok()) {
    outcome.status = absl::Status(
        response.status().code(),
        absl::StrCat("the engine's response: ", response.status().message()));
    return outcome;
  }
  outcome.client_body = std::move(response->client_body);
  outcome.body_changed = true;
  outcome.stripped_bytes = response->stripped_bytes;
  Store(request, response->choices, /*first_index=*/0,
        static_cast<int64_t>(response->choices.size()), response->response_id, outcome);
  return outcome;
}

CaptureOutcome CaptureRecorder::RecordStreamed(const CapturedRequest& request,
                                               const EngineChoice& choice, int64_t index,
                                               const std::string& response_id) const {
  CaptureOutcome outcome;
  outcome.pool = request.headers.pool.value_or(default_pool_);
  // The index is the engine's: one outside the choices asked for names no
  // sample (and a negative one no identity).
  if (index < 0 || index >= request.forwarded.choices_asked) {
    outcome.status = absl::InvalidArgumentError(
        absl::StrCat("the engine streamed choice index ", index, "; the request asked for ",
                     request.forwarded.choices_asked, " choices"));
    return outcome;
  }
  Store(request, absl::MakeConstSpan(&choice, 1), index, request.forwarded.choices_asked,
        response_id, outcome);
  return outcome;
}

void CaptureRecorder::Store(const CapturedRequest& request,
                            absl::Span<const EngineChoice> choices, int64_t first_index,
                            int64_t total, const std::string& response_id,
                            CaptureOutcome& outcome) const {
  const std::string base_id = request.headers.sample_id.value_or(response_id);
  if (base_id.empty()) {
    outcome.status = absl::InvalidArgumentError(
        "the engine's response has no id and the request no X-Rollpack-Sample-Id");
    return;
  }
  if (choices.empty()) {
    outcome.status = absl::InvalidArgumentError("the engine's response has no choices");
    return;
  }
  if (request.turn != nullptr) {
    const std::string& session = request.turn->session();
    if (total != 1) {
      outcome.status = absl::InvalidArgumentError(absl::StrCat(
          "session ", session, ": the engine returned ", total, " choices; a session has one"));
      return;
    }
    if (std::optional<int64_t> at = CaptureSessions::PromptDiffers(
            request.turn->stored_tokens(), choices[0].prompt_ids);
        at.has_value()) {
      outcome.status = absl::FailedPreconditionError(absl::StrCat(
          "session ", session, ": prompt differs from the stored tokens at position ", *at));
      return;
    }
  }
  const std::vector<CapturedIdentity> identities =
      Identities(request, first_index, choices.size(), total, base_id);

  absl::StatusOr<ModelSpec> model = store_->GetOrAdoptModel(outcome.pool);
  absl::StatusOr<PoolOptions> options =
      model.ok() ? store_->GetOptions(outcome.pool) : absl::StatusOr<PoolOptions>(model.status());
  if (!options.ok()) {
    outcome.status = absl::Status(options.status().code(),
                                  absl::StrCat("pool \"", outcome.pool, "\": ",
                                               options.status().message()));
    return;
  }

  // Each usable choice is stored; the first reason another was not is named.
  std::vector<StoredSample> samples;
  std::vector<std::string> ids;
  absl::Status first_problem;
  for (size_t i = 0; i < choices.size(); ++i) {
    const CapturedIdentity& identity = identities[i];
    absl::StatusOr<v1::Sample> sample = CapturedSample(engine_, choices[i], *model,
                                                       request.forwarded.start_offset, identity);
    int64_t growth_budget = sample.ok() ? static_cast<int64_t>(sample->ByteSizeLong()) : 0;
    absl::StatusOr<StoredSample> stored =
        sample.ok() ? ValidateAndTakeSample(&*sample, *model, options->token_fields,
                                            &growth_budget)
                    : absl::StatusOr<StoredSample>(sample.status());
    if (!stored.ok()) {
      if (first_problem.ok()) first_problem = stored.status();
      continue;
    }
    samples.push_back(*std::move(stored));
    ids.push_back(identity.sample_id);
  }
  if (!samples.empty()) {
    absl::StatusOr<PutResult> put = store_->Put(outcome.pool, std::move(samples));
    if (!put.ok()) {
      if (metrics_ != nullptr) metrics_->OnPutRefused(outcome.pool, put.status().code());
      outcome.status = put.status();
      return;
    }
    if (metrics_ != nullptr) {
      metrics_->OnPut(outcome.pool, put->accepted, put->duplicates, put->stored_bytes);
    }
    outcome.samples_stored = put->accepted;
    outcome.sample_ids = std::move(ids);
  }
  outcome.status = first_problem;
}

SessionFinish CaptureRecorder::FinishSession(
    const std::string& pool, const std::string& session,
    const std::optional<std::map<std::string, double>>& scalars) const {
  SessionFinish finish;
  finish.sample_id = session;
  absl::StatusOr<std::unique_ptr<SessionTurn>> turn = sessions_.Begin(pool, session);
  if (!turn.ok()) {
    finish.status = turn.status();
    return finish;
  }
  if ((*turn)->stored_tokens().empty()) {
    finish.status = absl::NotFoundError(
        absl::StrCat("pool \"", pool, "\" has no open session ", session));
    return finish;
  }
  // A piece without tokens that seals: its token fields are there, empty.
  v1::Sample seal;
  seal.set_sample_id(session);
  seal.set_piece((*turn)->piece());
  seal.set_partial(false);
  seal.mutable_tokens()->set_dtype(v1::INT32);
  seal.mutable_tokens()->add_shape(0);
  for (const auto& [name, schema] : (*turn)->token_fields()) {
    v1::NDArray& field = (*seal.mutable_token_fields())[name];
    field.set_dtype(schema.dtype);
    field.add_shape(0);
    for (int64_t dim : schema.trailing_shape) field.add_shape(dim);
  }
  for (const auto& [name, value] : (*turn)->scalars()) (*seal.mutable_scalars())[name] = value;
  if (scalars.has_value()) {
    for (const auto& [name, value] : *scalars) {
      auto [it, added] = seal.mutable_scalars()->insert({name, value});
      if (!added && it->second != value) {
        finish.status = absl::FailedPreconditionError(absl::StrCat(
            "session ", session, ": scalar \"", name, "\" is ", it->second,
            " from its first turn, the finish says ", value));
        return finish;
      }
    }
  }
  absl::StatusOr<ModelSpec> model = store_->GetOrAdoptModel(pool);
  absl::StatusOr<PoolOptions> options =
      model.ok() ? store_->GetOptions(pool) : absl::StatusOr<PoolOptions>(model.status());
  absl::StatusOr<StoredSample> stored =
      options.ok() ? ValidateAndTakeSample(&seal, *model, options->token_fields)
                   : absl::StatusOr<StoredSample>(options.status());
  if (!stored.ok()) {
    finish.status = stored.status();
    return finish;
  }
  std::vector<StoredSample> samples;
  samples.push_back(*std::move(stored));
  absl::StatusOr<PutResult> put = store_->Put(pool, std::move(samples));
  finish.status = put.status();
  finish.tokens = static_cast<int64_t>((*turn)->stored_tokens().size());
  return finish;
}

}  // namespace rollpack
