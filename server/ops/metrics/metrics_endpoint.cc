#include "server/ops/metrics/metrics_endpoint.h"

#include <cstring>
#include <exception>
#include <fstream>
#include <sstream>

#include "CivetServer.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "civetweb.h"
#include "prometheus/exposer.h"
#include "spdlog/spdlog.h"

namespace rollpack::metrics {
namespace {

constexpr char kIndex[] = "rollpackd metrics: GET /metrics\n";

// civetweb reports why it could not start (the bind error, a bad key) only
// through its log callback, on the thread that starts it: collected here
// while Start() runs so the returned status can say it.
thread_local std::string* start_errors = nullptr;

int OnCivetLog(const mg_connection*, const char* message) {
  if (start_errors != nullptr) {
    if (!start_errors->empty()) start_errors->append("; ");
    start_errors->append(message);
  } else {
    spdlog::debug("metrics endpoint: {}", message);
  }
  return 1;  // handled: civetweb writes nothing itself
}

void Reply(mg_connection* conn, int code, const char* reason, const char* extra_headers,
           const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\n%sContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            code, reason, extra_headers, body.size());
  mg_write(conn, body.data(), body.size());
}

// Before civetweb's routing: the endpoint is read-only, answers "/" with
// what it serves, and serves /metrics only at that exact path (civetweb
// matches handlers by prefix).
int OnBeginRequest(mg_connection* conn) {
  const mg_request_info* request = mg_get_request_info(conn);
  const std::string method = request->request_method != nullptr ? request->request_method : "";
  if (method != "GET") {
    Reply(conn, 405, "Method Not Allowed", "Allow: GET\r\n", "read-only: only GET /metrics\n");
    return 405;
  }
  const char* uri = request->local_uri != nullptr ? request->local_uri : "";
  if (std::strcmp(uri, "/") == 0) {
    Reply(conn, 200, "OK", "", kIndex);
    return 200;
  }
  if (std::strcmp(uri, "/metrics") != 0) {
    Reply(conn, 404, "Not Found", "", "not found: GET /metrics\n");
    return 404;
  }
  return 0;  // the exposer's handler (and its basic auth)
}

bool SameSecret(const std::string& given, const std::string& expected) {
  // Every byte is compared: the time says nothing about how much matched.
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ (i < expected.size() ? expected[i] : 0));
  }
  return diff == 0;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " \"", path, "\""));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadBasicAuthFile(
    const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, "metrics basic-auth file");
  if (!text.ok()) return text.status();
  std::vector<std::pair<std::string, std::string>> users;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    absl::ConsumeSuffix(&line, "\r");
    // Only blank and comment lines are skipped: a password keeps its spaces.
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (stripped.empty() || stripped[0] == '#') continue;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0 || colon + 1 == line.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics basic-auth file \"", path, "\" line ", line_number,
                       ": expected user:password"));
    }
    users.emplace_back(std::string(line.substr(0, colon)), std::string(line.substr(colon + 1)));
  }
  if (users.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics basic-auth file \"", path, "\" names no user"));
  }
  return users;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const MetricsEndpointOptions& options, std::shared_ptr<ScrapeRegistry> registry) {
  const std::string& listen = options.listen;
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->registry_ = std::move(registry);
  std::vector<std::string> civet_options = {
      "listening_ports", absl::StrCat(host, ":", port),
      // A scrape is cheap; two workers keep the sidecar small.
      "num_threads", "2",
      // Close at once after a response: civetweb's graceful close otherwise
      // waits for the scraper to hang up first, which holds a worker (and
      // rollpackd's shutdown) for seconds while Prometheus keeps it open.
      "linger_timeout_ms", "-1"};

  CivetCallbacks callbacks;
  callbacks.begin_request = OnBeginRequest;
  callbacks.log_message = OnCivetLog;
  std::string errors;
  start_errors = &errors;
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(civet_options, &callbacks);
  } catch (const std::exception& e) {
    start_errors = nullptr;
    std::string why = errors.empty() ? e.what() : errors;
    if (why.find("Address already in use") != std::string::npos) why = "address in use";
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", listen, ": ", why));
  }
  start_errors = nullptr;
  // Auth before the collectable: civetweb already serves, and /metrics must
  // never answer without it.
  if (!options.basic_auth.empty()) {
    endpoint->exposer_->RegisterAuth(
        [users = options.basic_auth](const std::string& user, const std::string& password) {
          bool ok = false;
          for (const auto& [u, p] : users) ok |= SameSecret(user, u) & SameSecret(password, p);
          return ok;
        },
        "rollpackd metrics");
  }
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  endpoint->port_ = ports.empty() ? port : ports.front();
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() = default;

}  // namespace rollpack::metrics
