#include "server/ops/call_log.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.h"
#include "server/ops/guarded_peers.h"
#include "server/ops/server_metrics.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

// Notes of the calls in flight, by their context: written by handlers,
// taken by the interceptor when the status goes out. Only intercepted calls
// have an entry, so a handler's note for any other call is dropped. Each
// entry names the interceptor that opened it: a sync handler's context may
// be freed, and its address reused by a new call, before the old call's
// interceptor is gone, and that one must not take the new call's entry.
class Notes {
 public:
  void Open(const grpc::ServerContextBase* context, const void* owner) {
    absl::MutexLock lock(&mu_);
    notes_[context] = Entry{owner, std::string()};
  }
  void Set(const grpc::ServerContextBase* context, std::string note) {
    absl::MutexLock lock(&mu_);
    auto it = notes_.find(context);
    if (it != notes_.end()) it->second.note = std::move(note);
  }
  std::string Close(const grpc::ServerContextBase* context, const void* owner) {
    absl::MutexLock lock(&mu_);
    auto it = notes_.find(context);
    if (it == notes_.end() || it->second.owner != owner) return "";
    std::string note = std::move(it->second.note);
    notes_.erase(it);
    return note;
  }

 private:
  struct Entry {
    const void* owner;
    std::string note;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<const grpc::ServerContextBase*, Entry> notes_ ABSL_GUARDED_BY(mu_);
};

Notes& CallNotes() {
  static Notes* notes = new Notes();
  return *notes;
}

bool IsDataCall(const std::string& method) {
  return method == "/rollpack.v1.Rollouts/PutSamples";
}

// Calls that succeed many times per step with nothing for an operator:
// members' calls to each other and trainers' per-rank reports.
bool IsChatter(const std::string& method) {
  return absl::StartsWith(method, "/rollpack.v1.Member/") ||
         method == "/rollpack.v1.Telemetry/ReportRoutingAgreement";
}

bool IsPlumbing(const std::string& method) {
  return absl::StartsWith(method, "/grpc.health.") || absl::StartsWith(method, "/grpc.reflection.");
}

// What a client sends goes into the log only with its control characters
// escaped (no forged lines) and, for names it makes up, cut short.
std::string Printable(absl::string_view text, size_t max_bytes = std::string::npos) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 8);
  for (size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const unsigned char c = text[i];
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

// A method this server serves (its own, health, reflection), or "" for one
// a client made up: those share one name in the log and its rate limit.
std::string KnownMethod(const std::string& method) {
  absl::string_view m = method;
  absl::ConsumePrefix(&m, "/");
  const size_t slash = m.rfind('/');
  if (slash == absl::string_view::npos) return "";
  const std::string full = absl::StrCat(m.substr(0, slash), ".", m.substr(slash + 1));
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full) != nullptr
             ? method
             : "";
}

std::string ShortMethod(const std::string& method) {
  // "/rollpack.v1.Scheduler/CreateStep" -> "Scheduler/CreateStep"
  absl::string_view m = method;
  absl::ConsumePrefix(&m, "/");
  absl::ConsumePrefix(&m, "rollpack.v1.");
  return std::string(m);
}

}  // namespace

void AnnotateCall(const grpc::ServerContextBase* context, std::string note) {
  CallNotes().Set(context, std::move(note));
}

class CallLogInterceptor final : public grpc::experimental::Interceptor {
 public:
  CallLogInterceptor(CallLog* log, grpc::experimental::ServerRpcInfo* info)
      : log_(log),
        context_(info->server_context()),
        method_(info->method() != nullptr ? info->method() : ""),
        start_(std::chrono::steady_clock::now()) {
    CallNotes().Open(context_, this);
  }

  // Touches only what it owns: the context may be gone by now.
  ~CallLogInterceptor() override {
    const std::string note = CallNotes().Close(context_, this);
    if (!logged_) Write(grpc::StatusCode::CANCELLED, "the call ended before its status", note);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      // Who is calling, while the context surely exists.
      if (context_ != nullptr) peer_ = CallPeer(context_->peer());
      if (log_->auth_ != nullptr && log_->auth_->enabled()) {
        std::string authorization;
        if (auto* metadata = methods->GetRecvInitialMetadata(); metadata != nullptr) {
          auto it = metadata->find("authorization");
          if (it != metadata->end()) authorization.assign(it->second.data(), it->second.size());
        }
        role_ = log_->auth_->RoleOf(authorization);
      }
    }
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      Write(status.error_code(), status.error_message(), CallNotes().Close(context_, this));
    }
    methods->Proceed();
  }

 private:
  void Write(grpc::StatusCode code, const std::string& message, const std::string& note) {
    if (logged_) return;
    logged_ = true;
    CallLog::Call call;
    const std::string known = KnownMethod(method_);
    call.method = known.empty() ? absl::StrCat("unknown method ", Printable(method_, 64)) : known;
    call.code = code;
    call.message = message;
    call.note = note;
    call.elapsed = absl::FromChrono(std::chrono::steady_clock::now() - start_);
    call.peer = peer_.empty() ? "an unknown peer" : peer_;
    call.role = role_;
    log_->Log(call);
  }

  CallLog* const log_;
  const grpc::ServerContextBase* const context_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
  std::string peer_;
  std::string role_;
  bool logged_ = false;
};

namespace {

class CallLogInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallLogInterceptorFactory(CallLog* log) : log_(log) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallLogInterceptor(log_, info);
  }

 private:
  CallLog* const log_;
};

}  // namespace

CallLog::CallLog(const Authorizer* auth, CallLogOptions options)
    : auth_(auth), warnings_(options.warnings_per_window, options.warning_window) {}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallLog::InterceptorFactory() {
  return std::make_unique<CallLogInterceptorFactory>(this);
}

std::string CallLog::Format(const Call& call, int64_t dropped_before) {
  std::string line = absl::StrCat(ShortMethod(call.method), " from ", call.peer);
  if (!call.role.empty()) absl::StrAppend(&line, " (", call.role, ")");
  absl::StrAppend(&line, ": ", StatusCodeName(static_cast<int>(call.code)));
  if (call.code != grpc::StatusCode::OK && !call.message.empty()) {
    absl::StrAppend(&line, " \"", Printable(call.message), "\"");
  }
  absl::StrAppend(&line, " in ",
                  absl::FormatDuration(absl::Trunc(call.elapsed, absl::Microseconds(10))));
  if (!call.note.empty()) absl::StrAppend(&line, "; ", Printable(call.note));
  if (dropped_before > 0) {
    absl::StrAppend(&line, " (", dropped_before, " more like this were not logged)");
  }
  return line;
}

void CallLog::Log(const Call& call) {
  if (call.code == grpc::StatusCode::OK) {
    const bool quiet =
        IsDataCall(call.method) || IsChatter(call.method) || IsPlumbing(call.method);
    const spdlog::level::level_enum level = quiet ? spdlog::level::debug : spdlog::level::info;
    if (spdlog::should_log(level)) spdlog::log(level, "{}", Format(call, 0));
    return;
  }
  if (IsPlumbing(call.method) && !spdlog::should_log(spdlog::level::debug)) return;
  int64_t dropped = 0;
  // Made-up methods share one budget: a client cannot mint keys.
  const bool unknown = absl::StartsWith(call.method, "unknown method");
  const std::string key =
      absl::StrCat(unknown ? "unknown" : call.method, " ", static_cast<int>(call.code));
  if (!warnings_.Allow(key, absl::Now(), &dropped)) return;
  spdlog::warn("{}", Format(call, dropped));
}

}  // namespace rollpack
