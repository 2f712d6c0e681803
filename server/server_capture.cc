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

absl::StatusOr<ModelSpec> ReadModelFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read --capture-model ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  v1::ModelSpec spec;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = false;
  if (auto status = google::protobuf::util::JsonStringToMessage(text, &spec, parse);
      !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--capture-model ", path, " is not a rollpack.v1.ModelSpec in protobuf JSON: ",
        status.message().as_string()));
  }
  return FromProto(spec);
}

}  // namespace

absl::Status RollpackServer::StartCapture(const CaptureOptions& options) {
  if (options.pool.empty()) {
    return absl::InvalidArgumentError("--capture-listen needs --capture-pool (the default pool)");
  }
  if (!options.model_file.empty()) {
    ASSIGN_OR_RETURN(ModelSpec model, ReadModelFile(options.model_file));
    absl::StatusOr<bool> created = rollouts_->Register(options.pool, model, std::nullopt);
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrCat("--capture-model ", options.model_file, " on pool \"",
                                       options.pool, "\": ", created.status().message()));
    }
  }
  ASSIGN_OR_RETURN(capture_, CaptureServer::Start(options, store_.get(), metrics_.get(),
                                                  capture_metrics_.get(), auth_.get()));
  spdlog::info("rollpackd: capture port {} in front of {} ({}), default pool \"{}\"",
               capture_->port(), options.upstream,
               options.engine == Engine::kVllm ? "vllm" : "sglang", options.pool);
  return absl::OkStatus();
}

}  // namespace rollpack
