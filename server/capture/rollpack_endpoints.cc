#include "server/capture/rollpack_endpoints.h"

#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/ops/log_format.h"
#include "simdjson.h"

namespace rollpack {
namespace {

constexpr absl::string_view kAnnotatePath = "/rollpack/v1/annotate";

absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("the annotate body: ", what));
}

absl::StatusOr<v1::SampleAnnotation> ParseAnnotation(simdjson::dom::element element,
                                                     size_t index) {
  const std::string where = absl::StrCat("\"annotations\"[", index, "]");
  simdjson::dom::object object;
  if (element.get(object) != simdjson::SUCCESS) {
    return Malformed(absl::StrCat(where, " is not a JSON object"));
  }
  v1::SampleAnnotation annotation;
  bool has_id = false;
  for (auto [raw_key, value] : object) {
    const absl::string_view key = View(raw_key);
    if (key == "sample_id") {
      std::string_view id;
      if (value.get(id) != simdjson::SUCCESS || id.empty()) {
        return Malformed(absl::StrCat(where, ".sample_id is not a non-empty string"));
      }
      annotation.set_sample_id(std::string(id));
      has_id = true;
    } else if (key == "scalars") {
      ASSIGN_OR_RETURN(auto scalars, ParseScalarsJson(View(simdjson::minify(value)),
                                                      absl::StrCat("the annotate body's ", where,
                                                                   ".scalars")));
      annotation.mutable_scalars()->insert(scalars.begin(), scalars.end());
    } else {
      return Malformed(absl::StrCat(where, " has an unknown member \"", key,
                                    "\" (sample_id, scalars)"));
    }
  }
  if (!has_id) return Malformed(absl::StrCat(where, " has no sample_id"));
  return annotation;
}

EndpointReply Annotate(const AnnotateFunction& annotate, absl::string_view body,
                       const CaptureHeaders& headers, const std::string& default_pool) {
  EndpointReply reply;
  reply.error_type = "rollpack_annotate";
  absl::StatusOr<v1::AnnotateSamplesRequest> request =
      ParseAnnotateBody(body, headers, default_pool);
  if (!request.ok()) {
    reply.status = request.status();
    reply.error_type = "rollpack_request";
    reply.summary = "annotate: malformed body";
    return reply;
  }
  reply.summary = absl::StrCat("annotate pool ", request->pool(), ": ",
                               request->annotations_size(), " annotations");
  if (!annotate) {
    reply.status = absl::UnimplementedError("this rollpackd does not annotate samples");
    return reply;
  }
  absl::StatusOr<v1::AnnotateSamplesResponse> answer = annotate(*request);
  if (!answer.ok()) {
    reply.status = answer.status();
    return reply;
  }
  reply.body = absl::StrCat("{\"annotated\": ", answer->annotated(), "}");
  return reply;
}

EndpointReply FinishSession(const CaptureRecorder& recorder, absl::string_view method,
                            absl::string_view target, absl::string_view body,
                            const CaptureHeaders& headers) {
  EndpointReply reply;
  absl::StatusOr<SessionFinishRequest> finish =
      ParseSessionFinish(method, target, body, headers, recorder.default_pool());
  if (!finish.ok()) {
    reply.status = finish.status();
    reply.error_type = "rollpack_request";
    reply.summary = absl::StrCat(method, " ", target, ": ", finish.status().message());
    return reply;
  }
  SessionFinish finished = recorder.FinishSession(finish->pool, finish->session, finish->scalars);
  reply.error_type = "rollpack_session";
  reply.status = std::move(finished.status);
  reply.summary = absl::StrCat("session ", finish->session, " in pool ", finish->pool,
                               " sealed by finish: ", finished.tokens, " tokens");
  if (reply.status.ok()) {
    reply.body = absl::StrCat("{\"sample_id\": \"", JsonEscape(finished.sample_id),
                              "\", \"tokens\": ", finished.tokens, "}");
  } else {
    reply.summary = absl::StrCat("session ", finish->session, " in pool ", finish->pool,
                                 " not sealed");
  }
  return reply;
}

}  // namespace

absl::StatusOr<v1::AnnotateSamplesRequest> ParseAnnotateBody(absl::string_view body,
                                                             const CaptureHeaders& headers,
                                                             const std::string& default_pool) {
  v1::AnnotateSamplesRequest request;
  request.set_pool(headers.pool.value_or(default_pool));
  simdjson::dom::parser parser;
  simdjson::padded_string padded(body.data(), body.size());
  simdjson::dom::element root;
  if (auto error = parser.parse(padded).get(root); error) {
    return Malformed(absl::StrCat("not JSON: ", simdjson::error_message(error)));
  }
  simdjson::dom::object object;
  if (root.get(object) != simdjson::SUCCESS) return Malformed("not a JSON object");
  bool has_annotations = false;
  for (auto [raw_key, value] : object) {
    const absl::string_view key = View(raw_key);
    if (key == "pool") {
      std::string_view pool;
      if (value.get(pool) != simdjson::SUCCESS || pool.empty()) {
        return Malformed("\"pool\" is not a non-empty string");
      }
      request.set_pool(std::string(pool));
    } else if (key == "annotations") {
      simdjson::dom::array annotations;
      if (value.get(annotations) != simdjson::SUCCESS) {
        return Malformed("\"annotations\" is not a JSON array");
      }
      size_t index = 0;
      for (simdjson::dom::element element : annotations) {
        ASSIGN_OR_RETURN(*request.add_annotations(), ParseAnnotation(element, index));
        ++index;
      }
      has_annotations = true;
    } else {
      return Malformed(absl::StrCat("unknown member \"", key, "\" (pool, annotations)"));
    }
  }
  if (!has_annotations) return Malformed("no \"annotations\"");
  return request;
}

EndpointReply ServeRollpackEndpoint(const CaptureRecorder& recorder,
                                    const AnnotateFunction& annotate, absl::string_view method,
                                    absl::string_view target, absl::string_view body,
                                    const CaptureHeaders& headers) {
  const absl::string_view path = target.substr(0, target.find('?'));
  if (path == kAnnotatePath) {
    if (method != "POST") {
      EndpointReply reply;
      reply.status = absl::NotFoundError(
          absl::StrCat("no rollpack endpoint ", method, " ", path, " (POST ", kAnnotatePath, ")"));
      reply.error_type = "rollpack_request";
      reply.summary = std::string(reply.status.message());
      return reply;
    }
    return Annotate(annotate, body, headers, recorder.default_pool());
  }
  return FinishSession(recorder, method, target, body, headers);
}

}  // namespace rollpack
