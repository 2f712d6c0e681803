// RollpackServer's capture port (shared/spec/capture.md section 1): the
// default pool's model from --capture-model, registered like RegisterModel,
// then the proxy.
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "server/ingest/rollouts_service.h"
#include "server/server.h"
#include "server/store/convert.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

// `path`'s protobuf JSON as a `Message`, refusing unknown fields: a typo
// in a flag's file must not start a pool with default options.
template <typename Message>
absl::StatusOr<Message> ReadJsonFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", flag, " ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  Message message;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = false;
  if (auto status = google::protobuf::util::JsonStringToMessage(buffer.str(), &message, parse);
      !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is not a ",
                                                   Message::descriptor()->full_name(),
                                                   " in protobuf JSON: ",
                                                   status.message().as_string()));
  }
  return message;
}

}  // namespace

absl::Status RollpackServer::StartCapture(const CaptureOptions& options) {
  if (options.pool.empty()) {
    return absl::InvalidArgumentError("--capture-listen needs --capture-pool (the default pool)");
  }
  if (!options.pool_options_file.empty() && options.model_file.empty()) {
    return absl::InvalidArgumentError(
        "--capture-pool-options needs --capture-model (the options are registered with it)");
  }
  if (!options.model_file.empty()) {
    ASSIGN_OR_RETURN(v1::ModelSpec spec,
                     ReadJsonFile<v1::ModelSpec>("--capture-model", options.model_file));
    const ModelSpec model = FromProto(spec);
    std::optional<PoolOptions> pool_options;
    if (!options.pool_options_file.empty()) {
      ASSIGN_OR_RETURN(v1::PoolOptions wire, ReadJsonFile<v1::PoolOptions>(
                                                 "--capture-pool-options",
                                                 options.pool_options_file));
      absl::StatusOr<PoolOptions> parsed = FromProto(wire);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--capture-pool-options ",
                                                       options.pool_options_file, ": ",
                                                       parsed.status().message()));
      }
      pool_options = *std::move(parsed);
    }
    absl::StatusOr<bool> created = rollouts_->Register(options.pool, model, pool_options);
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrCat("--capture-model ", options.model_file, " on pool \"",
                                       options.pool, "\": ", created.status().message()));
    }
  }
  // The HTTP form of AnnotateSamples answers exactly as the RPC does, in
  // cluster mode for samples on any member.
  AnnotateFunction annotate = [rollouts = rollouts_.get()](const v1::AnnotateSamplesRequest& request)
      -> absl::StatusOr<v1::AnnotateSamplesResponse> {
    ASSIGN_OR_RETURN(int32_t annotated, rollouts->Annotate(request));
    v1::AnnotateSamplesResponse response;
    response.set_annotated(annotated);
    return response;
  };
  // A drained cluster member captures nothing new (docs/cluster.md).
  IntakeCheck intake = [rollouts = rollouts_.get()] { return rollouts->AcceptsNewSamples(); };
  ASSIGN_OR_RETURN(capture_, CaptureServer::Start(options, store_.get(), metrics_.get(),
                                                  capture_metrics_.get(), auth_.get(),
                                                  std::move(annotate), std::move(intake)));
  spdlog::info("rollpackd: capture port {} in front of {} ({}), default pool \"{}\"",
               capture_->port(), options.upstream,
               options.engine == Engine::kVllm ? "vllm" : "sglang", options.pool);
  return absl::OkStatus();
}

}  // namespace rollpack
