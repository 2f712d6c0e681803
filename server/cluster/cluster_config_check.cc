#include "server/cluster/cluster_config_check.h"

#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/cluster/key_value_store.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

// The host of "host:port" ("[::1]:5" -> "[::1]"); the whole text without a
// colon.
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// The host of an etcd endpoint: "https://etcd-0:2379" -> "etcd-0".
std::string EndpointHost(std::string endpoint) {
  for (const char* scheme : {"http://", "https://"}) {
    if (absl::StartsWith(endpoint, scheme)) endpoint = endpoint.substr(std::string(scheme).size());
  }
  return HostOf(endpoint.substr(0, endpoint.find('/')));
}

}  // namespace

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "[::0]" ||
         host == "*";
}

bool IsLoopbackHost(const std::string& host) {
  const std::string h = absl::AsciiStrToLower(host);
  return h == "localhost" || absl::StartsWith(h, "127.") || h == "[::1]" || h == "::1";
}

absl::Status CheckAdvertisable(const std::string& listen, const std::string& advertise) {
  if (!advertise.empty()) {
    if (IsWildcardHost(HostOf(advertise))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cluster-advertise \"", advertise,
          "\" is a wildcard address, which no other member can dial: give the host:port they "
          "reach this member at (its pod IP, host name or DNS name)"));
    }
    return absl::OkStatus();
  }
  if (IsWildcardHost(HostOf(listen))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen \"", listen,
        "\" listens on every address, and with --cluster-etcd this member would advertise "
        "127.0.0.1 in its place, which every other member reads as itself: set "
        "--cluster-advertise to the host:port the others reach this member at"));
  }
  return absl::OkStatus();
}

std::optional<std::string> LoopbackAdvertiseWarning(const std::string& listen,
                                                    const std::string& advertise,
                                                    const std::vector<std::string>& etcd) {
  const std::string advertised = advertise.empty() ? listen : advertise;
  if (!IsLoopbackHost(HostOf(advertised))) return std::nullopt;
  for (const std::string& endpoint : etcd) {
    if (IsLoopbackHost(EndpointHost(endpoint))) continue;
    return absl::StrCat(
        "this member advertises ", advertised, " (",
        advertise.empty() ? "--listen" : "--cluster-advertise",
        "), a loopback address, while etcd ", endpoint,
        " is on another host: members on other hosts cannot reach it. Set "
        "--cluster-advertise to an address they can dial unless every member runs on this host");
  }
  return std::nullopt;
}

std::map<std::string, int> MembersByCluster(const std::vector<std::string>& keys,
                                            const std::string& name, const std::string& self_id) {
  std::map<std::string, std::set<std::string>> ids;
  for (const std::string& key : keys) {
    // "/<cluster>/members/<id>" or "/<cluster>/roster/<id>"; ids hold '/'
    // no more than cluster names do, but a key of another layout is skipped.
    std::vector<std::string> parts = absl::StrSplit(key, absl::MaxSplits('/', 3));
    if (parts.size() != 4 || !parts[0].empty() || parts[1].empty() || parts[3].empty()) continue;
    if (parts[2] != "members" && parts[2] != "roster") continue;
    if (parts[1] == name && parts[3] == self_id) continue;
    ids[parts[1]].insert(parts[3]);
  }
  std::map<std::string, int> counts;
  for (const auto& [cluster, members] : ids) counts[cluster] = static_cast<int>(members.size());
  return counts;
}

std::optional<std::string> MisnamedClusterWarning(const std::map<std::string, int>& members,
                                                  const std::string& name) {
  if (members.count(name) > 0 || members.empty()) return std::nullopt;
  std::vector<std::string> others;
  for (const auto& [cluster, count] : members) {
    others.push_back(absl::StrCat("\"", cluster, "\" (", count, ")"));
  }
  return absl::StrCat("cluster \"", name, "\" has no other member; etcd holds members of ",
                      absl::StrJoin(others, ", "),
                      ": is --cluster-name right? (Ignore this when starting the first member "
                      "of a new cluster.)");
}

void WarnIfClusterLooksMisnamed(KeyValueStore& etcd, const std::string& name,
                                const std::string& self_id) {
  // Once at join: every cluster's keys sit under "/", and they are small
  // (memberships, pools, step records).
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> listed = etcd.GetPrefix("/");
  if (!listed.ok()) {
    // etcd auth confines a member to its cluster's prefix: nothing to say.
    if (listed.status().code() != absl::StatusCode::kPermissionDenied) {
      spdlog::debug("rollpackd: cluster name check skipped: {}", listed.status().ToString());
    }
    return;
  }
  std::vector<std::string> keys;
  keys.reserve(listed->size());
  for (auto& [key, value] : *listed) keys.push_back(std::move(key));
  if (std::optional<std::string> warning =
          MisnamedClusterWarning(MembersByCluster(keys, name, self_id), name)) {
    spdlog::warn("rollpackd: {}", *warning);
  }
}

}  // namespace rollpack
