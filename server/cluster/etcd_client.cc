#include "server/cluster/etcd_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

// etcd's gRPC server takes messages of --max-request-bytes plus this much
// (etcd 3.4, v3rpc/grpc.go grpcOverheadBytes).
constexpr int64_t kEtcdGrpcOverheadBytes = 512 << 10;
// etcd's --max-request-bytes when not given.
constexpr int64_t kEtcdDefaultMaxRequestBytes = 1536 << 10;

// The limit in gRPC's refusal "received message larger than max (N vs. M)"
// (M: etcd's --max-request-bytes plus its gRPC overhead); 0 when the message
// does not say it.
int64_t GrpcMessageLimit(absl::string_view message) {
  const size_t open = message.find("larger than max (");
  if (open == absl::string_view::npos) return 0;
  absl::string_view rest = message.substr(open + std::strlen("larger than max ("));
  const size_t vs = rest.find(" vs. ");
  const size_t close = rest.find(')');
  if (vs == absl::string_view::npos || close == absl::string_view::npos || close < vs) return 0;
  int64_t limit = 0;
  if (!absl::SimpleAtoi(rest.substr(vs + 5, close - vs - 5), &limit)) return 0;
  return limit;
}

}  // namespace

std::string PrefixRangeEnd(absl::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xFF) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  std::vector<std::string> hosts;
  int secure = 0;
  for (const std::string& endpoint : options.endpoints) {
    absl::string_view e = endpoint;
    if (absl::ConsumePrefix(&e, "https://")) {
      ++secure;
      if (options.tls_ca.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--cluster-etcd endpoint \"", endpoint, "\" is https:// and no --cluster-etcd-ca "
            "was given"));
      }
    } else if (!options.tls_ca.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cluster-etcd endpoint \"", endpoint, "\" is not https:// but --cluster-etcd-ca "
          "was given: every endpoint is reached over TLS or none"));
    }
    absl::ConsumePrefix(&e, "http://");
    absl::ConsumeSuffix(&e, "/");
    if (e.empty() || !absl::StrContains(e, ':')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cluster-etcd endpoint \"", endpoint, "\" is not host:port or http://host:port"));
    }
    hosts.emplace_back(e);
  }
  if (hosts.empty()) return absl::InvalidArgumentError("--cluster-etcd names no endpoint");
  if (secure > 1) {
    // One channel over several addresses has one authority: no certificate
    // check would match each member. A Service or DNS name in front does.
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-etcd: ", secure, " https:// endpoints; give one (a name every etcd member's "
        "certificate lists, such as its client Service)"));
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--cluster-etcd-cert and --cluster-etcd-key are given together or not at all");
  }
  if (!options.tls_cert.empty() && secure == 0) {
    return absl::InvalidArgumentError(
        "--cluster-etcd-cert needs https:// etcd endpoints and --cluster-etcd-ca");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (secure > 0) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_ca;
    ssl.pem_cert_chain = options.tls_cert;
    ssl.pem_private_key = options.tls_key;
    credentials = options.credentials != nullptr ? options.credentials : grpc::SslCredentials(ssl);
  }
  // One channel over every endpoint: pick_first moves to the next when one
  // fails, so a 3-member etcd that loses one keeps answering. gRPC's ipv4:
  // target lists several addresses; a host name works alone.
  const std::string joined = absl::StrJoin(hosts, ",");
  bool all_ipv4 = true;
  for (const std::string& h : hosts) {
    in_addr unused;
    all_ipv4 = all_ipv4 && inet_pton(AF_INET, h.substr(0, h.rfind(':')).c_str(), &unused) == 1;
  }
  if (!all_ipv4 && hosts.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster-etcd \"", joined, "\": several endpoints must be IPv4 addresses"));
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Step records (cluster_steps.h) grow with the step; etcd's own
  // --max-request-bytes is the limit that matters.
  args.SetMaxReceiveMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(all_ipv4 ? absl::StrCat("ipv4:", joined) : joined,
                                           credentials, args);
  return std::unique_ptr<EtcdClient>(
      new EtcdClient(std::move(channel), joined, options.timeout, options.total_timeout));
}

EtcdClient::EtcdClient(std::shared_ptr<grpc::Channel> channel, std::string endpoints,
                       absl::Duration timeout, absl::Duration total_timeout)
    : channel_(std::move(channel)),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)),
      endpoints_(std::move(endpoints)),
      timeout_(timeout),
      total_timeout_(total_timeout),
      reachability_(timeout) {}

void EtcdClient::SetReachabilityListener(std::function<void(bool reachable)> listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

grpc::Status EtcdClient::Call(
    const std::function<grpc::Status(grpc::ClientContext*)>& rpc) const {
  // etcd answers UNAVAILABLE or stalls past a deadline while it fails over
  // (an endpoint gone, a leader election of a second or two): every call
  // here is idempotent, so it is tried again until the total budget.
  const absl::Time give_up = absl::Now() + total_timeout_;
  while (true) {
    grpc::ClientContext context;
    const absl::Time started = absl::Now();
    const absl::Duration left = std::max(give_up - started, absl::Milliseconds(1));
    const int64_t leaving = leaving_deadline_nanos_.load();
    SetDeadline(&context, leaving != 0 ? absl::Nanoseconds(leaving) : std::min(timeout_, left));
    grpc::Status s = rpc(&context);
    const absl::Time now = absl::Now();
    const bool transient = Record(started, now, s);
    if (!transient || leaving_deadline_nanos_.load() != 0 ||
        now + absl::Milliseconds(100) >= give_up) {
      return s;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

bool EtcdClient::Record(absl::Time started, absl::Time ended, const grpc::Status& status) const {
  const bool transient = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  // What the cluster's member list watches for (Cluster::Members): etcd
  // away, slow, or answering again after it was away.
  const bool was_failing = failing_.exchange(transient);
  if (transient || was_failing || ended - started > absl::Seconds(1)) {
    trouble_nanos_.store(absl::ToUnixNanos(ended));
  }
  const EtcdReachability::Change change =
      reachability_.Observe(started, ended, transient, status.error_message());
  if (change != EtcdReachability::Change::kNone) Announce(change);
  return transient;
}

bool EtcdClient::Probe(absl::Duration deadline) const {
  etcdserverpb::RangeRequest request;
  request.set_key(std::string(1, '\0'));
  request.set_keys_only(true);
  etcdserverpb::RangeResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, deadline);
  const absl::Time started = absl::Now();
  const grpc::Status s = kv_->Range(&context, request, &response);
  return !Record(started, absl::Now(), s);
}

void EtcdClient::Announce(EtcdReachability::Change change) const {
  // Once per change, never per failed call: a change needs etcd to stay
  // away (or to answer) for a whole attempt's deadline first.
  const EtcdReachability::State state = reachability_.state();
  if (change == EtcdReachability::Change::kLost) {
    spdlog::warn("rollpackd: etcd unreachable (endpoints {}; last error: {}): membership and new "
                 "pools wait; puts to known pools go on",
                 endpoints_, state.last_error);
  } else {
    spdlog::info("rollpackd: etcd reachable again after {}",
                 absl::FormatDuration(absl::Trunc(state.last_outage, absl::Milliseconds(100))));
  }
  std::function<void(bool)> listener;
  {
    absl::MutexLock lock(&listener_mu_);
    listener = listener_;
  }
  if (listener) listener(change == EtcdReachability::Change::kRegained);
}

absl::Time EtcdClient::last_trouble() const {
  const int64_t nanos = trouble_nanos_.load();
  return nanos == 0 ? absl::InfinitePast() : absl::FromUnixNanos(nanos);
}

absl::Status EtcdClient::Error(const grpc::Status& status, absl::string_view what) const {
  // A request over etcd's --max-request-bytes: etcd refuses it ("request is
  // too large"), or, past that limit plus etcd's gRPC overhead, gRPC does
  // (RESOURCE_EXHAUSTED "received message larger than max (N vs. M)"). etcd's
  // other RESOURCE_EXHAUSTED (too many requests, database full) pass or need
  // an operator: UNAVAILABLE below.
  const std::string& message = status.error_message();
  const int64_t grpc_limit = status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED
                                 ? GrpcMessageLimit(message)
                                 : 0;
  if (grpc_limit > 0 || absl::StrContains(message, "request is too large")) {
    const std::string limit =
        grpc_limit > kEtcdGrpcOverheadBytes
            ? absl::StrCat("etcd's request limit of ", grpc_limit - kEtcdGrpcOverheadBytes,
                           " bytes (--max-request-bytes)")
            : absl::StrCat("etcd's request limit (--max-request-bytes; ",
                           kEtcdDefaultMaxRequestBytes, " bytes by default)");
    return absl::ResourceExhaustedError(absl::StrCat(
        "etcd (", endpoints_, "): ", what, ": the request is over ", limit, ": \"", message,
        "\"; raise etcd's --max-request-bytes (docs/cluster.md, \"Sizing\")"));
  }
  // Whatever went wrong between us and etcd, the cluster's coordination is
  // unavailable for now; callers retry or refuse with UNAVAILABLE.
  return absl::UnavailableError(absl::StrCat("etcd (", endpoints_, "): ", what, ": ",
                                             status.error_message()));
}

absl::StatusOr<KeyRevisions> EtcdClient::Revisions(const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_keys_only(true);
  etcdserverpb::RangeResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Range(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("get ", key));
  if (response.kvs_size() == 0) return KeyRevisions{};
  return KeyRevisions{response.kvs(0).create_revision(), response.kvs(0).mod_revision()};
}

absl::StatusOr<std::vector<EtcdKeyValue>> EtcdClient::ListPrefix(const std::string& prefix,
                                                                int64_t* revision) {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(PrefixRangeEnd(prefix));
  request.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  request.set_sort_target(etcdserverpb::RangeRequest::KEY);
  etcdserverpb::RangeResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Range(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("list ", prefix));
  if (revision != nullptr) *revision = response.header().revision();
  std::vector<EtcdKeyValue> out;
  out.reserve(response.kvs_size());
  for (const auto& kv : response.kvs()) {
    out.push_back({kv.key(), kv.value(), kv.lease(), kv.mod_revision()});
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> EtcdClient::ListPrefixKeys(
    const std::string& prefix) {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(PrefixRangeEnd(prefix));
  request.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  request.set_sort_target(etcdserverpb::RangeRequest::KEY);
  request.set_keys_only(true);
  etcdserverpb::RangeResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Range(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("list keys ", prefix));
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(response.kvs_size());
  for (const auto& kv : response.kvs()) out.emplace_back(kv.key(), kv.mod_revision());
  return out;
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::GetEntry(const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Range(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("get ", key));
  if (response.kvs_size() == 0) return std::optional<EtcdKeyValue>();
  const auto& kv = response.kvs(0);
  return std::optional<EtcdKeyValue>(
      EtcdKeyValue{kv.key(), kv.value(), kv.lease(), kv.mod_revision()});
}

absl::StatusOr<bool> EtcdClient::ReplaceIfUnchanged(const std::string& key,
                                                    int64_t mod_revision,
                                                    const std::string& value, int64_t lease) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* unchanged = request.add_compare();
  unchanged->set_key(key);
  unchanged->set_target(etcdserverpb::Compare::MOD);
  unchanged->set_result(etcdserverpb::Compare::EQUAL);
  unchanged->set_mod_revision(mod_revision);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  etcdserverpb::TxnResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Txn(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("replace ", key));
  return response.succeeded();
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Put(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("put ", key));
  return absl::OkStatus();
}

absl::StatusOr<std::string> EtcdClient::CreateIfAbsent(const std::string& key,
                                                       const std::string& value, bool* created,
                                                       int64_t lease, int64_t* mod_revision) {
  *created = false;
  if (mod_revision != nullptr) *mod_revision = 0;
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(key);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  request.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Txn(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("create ", key));
  if (response.succeeded()) {
    *created = true;
    // The transaction's revision is the put's.
    if (mod_revision != nullptr) *mod_revision = response.header().revision();
    return value;
  }
  if (response.responses_size() == 1 && response.responses(0).has_response_range() &&
      response.responses(0).response_range().kvs_size() == 1) {
    const auto& kv = response.responses(0).response_range().kvs(0);
    if (mod_revision != nullptr) *mod_revision = kv.mod_revision();
    return kv.value();
  }
  // Deleted between the compare and the read: nothing holds it now.
  return absl::AbortedError(absl::StrCat("etcd: ", key, " changed during its creation; retry"));
}

absl::Status EtcdClient::Delete(const std::string& key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  etcdserverpb::DeleteRangeResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->DeleteRange(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("delete ", key));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> EtcdClient::DeleteAll(const std::vector<std::string>& keys) {
  // One transaction with no compare: every delete, or none.
  etcdserverpb::TxnRequest request;
  for (const std::string& key : keys) request.add_success()->mutable_request_delete_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return kv_->Txn(context, request, &response);
  });
  if (!s.ok()) return Error(s, absl::StrCat("delete ", keys.size(), " keys"));
  int64_t deleted = 0;
  for (const etcdserverpb::ResponseOp& op : response.responses()) {
    deleted += op.response_delete_range().deleted();
  }
  return deleted;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
  etcdserverpb::LeaseGrantResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return lease_->LeaseGrant(context, request, &response);
  });
  if (!s.ok()) return Error(s, "grant lease");
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd: grant lease: ", response.error()));
  }
  return response.id();
}

absl::Status EtcdClient::KeepAlive(int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    auto stream = lease_->LeaseKeepAlive(context);
    const bool exchanged = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    grpc::Status finished = stream->Finish();
    if (finished.ok() && !exchanged) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed");
    }
    return finished;
  });
  if (!s.ok()) return Error(s, "keep lease alive");
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd: lease ", lease, " has expired"));
  }
  return absl::OkStatus();
}

void EtcdClient::StopRetrying(absl::Duration deadline) {
  leaving_deadline_nanos_.store(std::max<int64_t>(1, absl::ToInt64Nanoseconds(deadline)));
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  grpc::Status s = Call([&](grpc::ClientContext* context) {
    return lease_->LeaseRevoke(context, request, &response);
  });
  if (!s.ok()) return Error(s, "revoke lease");
  return absl::OkStatus();
}

}  // namespace rollpack
