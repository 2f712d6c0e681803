#include "server/ops/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

// Compares without an early exit on the first differing byte.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

constexpr size_t kMinTokenLength = 16;

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kProducer:
      return "producer";
    case Role::kTrainer:
      return "trainer";
    case Role::kAdmin:
      return "admin";
    case Role::kMember:
      return "member";
  }
  return "unknown";
}

const std::map<std::string, std::set<Role>>& MethodRoles() {
  static const auto* const kTable = new std::map<std::string, std::set<Role>>{
      {"/rollpack.v1.Rollouts/RegisterModel", {Role::kProducer, Role::kAdmin}},
      {"/rollpack.v1.Rollouts/PutSamples", {Role::kProducer, Role::kAdmin}},
      // Scalars added to stored samples (lifecycle.md 6): a reward worker
      // writes them as a rollout worker writes samples (a controller that
      // computes rewards itself uses an admin or producer token).
      {"/rollpack.v1.Rollouts/AnnotateSamples", {Role::kProducer, Role::kAdmin}},
      // Members ask each other for their local share (local_only).
      {"/rollpack.v1.Rollouts/GetPool",
       {Role::kProducer, Role::kTrainer, Role::kAdmin, Role::kMember}},
      {"/rollpack.v1.Rollouts/ListPools", {Role::kProducer, Role::kTrainer, Role::kAdmin}},
      // Deleting a pool is the operator's (admin); members delete their
      // own share when one of them is asked (local_only: rollouts_pools.cc
      // takes the admin token for the cluster-wide call).
      {"/rollpack.v1.Rollouts/DeletePool", {Role::kAdmin, Role::kMember}},
      // Samples' metadata, as GetPool's counts (members merge local pages).
      {"/rollpack.v1.Rollouts/ListSamples",
       {Role::kProducer, Role::kTrainer, Role::kAdmin, Role::kMember}},
      {"/rollpack.v1.Scheduler/CreateStep", {Role::kTrainer, Role::kAdmin}},
      {"/rollpack.v1.Scheduler/GetPlan", {Role::kTrainer, Role::kAdmin}},
      {"/rollpack.v1.Scheduler/ReleaseStep", {Role::kAdmin}},
      // The trainer reports the policy version it trains (lifecycle.md).
      {"/rollpack.v1.Scheduler/SetPolicyVersion", {Role::kTrainer, Role::kAdmin, Role::kMember}},
      // A controller finding its steps again (docs/operations.md).
      {"/rollpack.v1.Scheduler/ListSteps", {Role::kTrainer, Role::kAdmin}},
      {"/rollpack.v1.Trainer/FetchMicrobatches", {Role::kTrainer, Role::kAdmin}},
      {"/rollpack.v1.Trainer/FetchPieces", {Role::kTrainer, Role::kAdmin}},
      // R2: ranks upload their recorded routing; the controller commits it.
      {"/rollpack.v1.Trainer/UploadRouting", {Role::kTrainer, Role::kAdmin}},
      {"/rollpack.v1.Trainer/CommitRouting", {Role::kTrainer, Role::kAdmin}},
      // TP-leader trainers exchange their NCCL id here (docs/trainer.md).
      {"/rollpack.v1.Rendezvous/ExchangeId", {Role::kTrainer, Role::kAdmin}},
      // Trainers report routing agreement (docs/trainer.md).
      {"/rollpack.v1.Telemetry/ReportRoutingAgreement", {Role::kTrainer, Role::kAdmin}},
      // Members of a cluster call each other (docs/cluster.md): a member
      // certificate, never a token (Authorizer::set_member_identity).
      {"/rollpack.v1.Member/ListFreeSamples", {Role::kMember}},
      {"/rollpack.v1.Member/HoldSamples", {Role::kMember}},
      {"/rollpack.v1.Member/ConfirmHold", {Role::kMember}},
      {"/rollpack.v1.Member/DropHold", {Role::kMember}},
      {"/rollpack.v1.Member/ReleaseHold", {Role::kMember}},
      {"/rollpack.v1.Member/DropGroups", {Role::kMember}},
      {"/rollpack.v1.Member/ReadSamples", {Role::kMember}},
      {"/rollpack.v1.Member/StageRouting", {Role::kMember}},
      {"/rollpack.v1.Member/CheckRouting", {Role::kMember}},
      {"/rollpack.v1.Member/CommitRouting", {Role::kMember}},
      {"/rollpack.v1.Member/PrepareAnnotations", {Role::kMember}},
      {"/rollpack.v1.Member/CommitAnnotations", {Role::kMember}},
      {"/rollpack.v1.Member/AbortAnnotations", {Role::kMember}},
      {"/rollpack.v1.Member/LocalStatus", {Role::kMember}},
      {"/rollpack.v1.Member/StepStreams", {Role::kMember}},
      // Operating the cluster (cluster_admin.proto): operators only.
      {"/rollpack.v1.ClusterAdmin/GetClusterStatus", {Role::kAdmin}},
      {"/rollpack.v1.ClusterAdmin/DrainMember", {Role::kAdmin}},
      {"/rollpack.v1.ClusterAdmin/UndrainMember", {Role::kAdmin}},
  };
  return *kTable;
}

absl::StatusOr<Authorizer> Authorizer::Parse(const std::string& text) {
  Authorizer auth;
  Tokens tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<std::string> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth tokens line ", line_number, ": want `ROLE TOKEN`"));
    }
    Role role;
    if (fields[0] == "producer") {
      role = Role::kProducer;
    } else if (fields[0] == "trainer") {
      role = Role::kTrainer;
    } else if (fields[0] == "admin") {
      role = Role::kAdmin;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("auth tokens line ", line_number,
                                                     ": unknown role \"", fields[0],
                                                     "\" (producer, trainer or admin)"));
    }
    if (fields[1].size() < kMinTokenLength) {
      return absl::InvalidArgumentError(absl::StrCat("auth tokens line ", line_number,
                                                     ": token shorter than ", kMinTokenLength,
                                                     " characters"));
    }
    for (const Entry& e : tokens) {
      if (e.token == fields[1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("auth tokens line ", line_number, ": token listed twice"));
      }
    }
    tokens.push_back({fields[1], role});
  }
  auth.tokens_ = std::make_shared<const Tokens>(std::move(tokens));
  return auth;
}

absl::Status Authorizer::ReloadTokens(const std::string& path) {
  ASSIGN_OR_RETURN(Authorizer read, FromFile(path));
  std::atomic_store(&tokens_, read.tokens());
  return absl::OkStatus();
}

absl::StatusOr<Authorizer> Authorizer::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read auth tokens file ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Authorizer> auth = Parse(text.str());
  if (auth.ok() && !auth->enabled()) {
    return absl::InvalidArgumentError(absl::StrCat("auth tokens file ", path, " has no tokens"));
  }
  return auth;
}

grpc::Status Authorizer::Check(const grpc::ServerContextBase& context,
                               const std::string& method) const {
  if (!enabled() && member_identity_.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  const auto it = md.find("authorization");
  std::string header;
  if (it != md.end()) header.assign(it->second.data(), it->second.size());
  const std::shared_ptr<const grpc::AuthContext> peer = context.auth_context();
  return CheckCall(header, peer.get(), method);
}

bool Authorizer::IsMember(const grpc::AuthContext& peer) const {
  if (member_identity_.empty() || !peer.IsPeerAuthenticated()) return false;
  // gRPC sets the property only from a certificate its TLS handshake
  // verified against the port's client CA.
  for (const grpc::string_ref& name : peer.FindPropertyValues("x509_common_name")) {
    if (absl::string_view(name.data(), name.size()) == member_identity_) return true;
  }
  return false;
}

grpc::Status Authorizer::CheckCall(const std::string& authorization,
                                   const grpc::AuthContext* peer,
                                   const std::string& method) const {
  if (!member_identity_.empty()) {
    const auto& table = MethodRoles();
    const auto allowed = table.find(method);
    const bool member_may = allowed != table.end() && allowed->second.count(Role::kMember) > 0;
    if (member_may && peer != nullptr && IsMember(*peer)) return grpc::Status::OK;
    if (member_may && allowed->second.size() == 1) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat(method, " answers cluster members only: a client "
                                       "certificate with Common Name \"", member_identity_,
                                       "\""));
    }
  }
  return CheckHeader(authorization, method);
}

std::string Authorizer::RoleOf(const std::string& authorization) const {
  if (!enabled()) return "";
  absl::string_view value = authorization;
  if (!absl::ConsumePrefix(&value, "Bearer ") && !absl::ConsumePrefix(&value, "bearer ")) {
    return "no token";
  }
  const std::string token(absl::StripAsciiWhitespace(value));
  const Entry* match = nullptr;
  const std::shared_ptr<const Tokens> tokens = this->tokens();
  for (const Entry& e : *tokens) {
    if (ConstantTimeEquals(e.token, token) && match == nullptr) match = &e;
  }
  return match != nullptr ? RoleName(match->role) : "unknown token";
}

grpc::Status Authorizer::Authenticate(const std::string& authorization, Role* role) const {
  if (authorization.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing `authorization: Bearer <token>` metadata");
  }
  absl::string_view value = authorization;
  if (!absl::ConsumePrefix(&value, "Bearer ") && !absl::ConsumePrefix(&value, "bearer ")) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization metadata is not `Bearer <token>`");
  }
  value = absl::StripAsciiWhitespace(value);
  const std::string token(value);
  const Entry* match = nullptr;
  const std::shared_ptr<const Tokens> tokens = this->tokens();
  for (const Entry& e : *tokens) {  // no early exit: same time for every entry
    if (ConstantTimeEquals(e.token, token) && match == nullptr) match = &e;
  }
  if (match == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown token");
  }
  *role = match->role;
  return grpc::Status::OK;
}

grpc::Status Authorizer::CheckHeader(const std::string& authorization,
                                     const std::string& method) const {
  if (!enabled()) return grpc::Status::OK;
  Role role;
  if (grpc::Status s = Authenticate(authorization, &role); !s.ok()) return s;
  const auto& table = MethodRoles();
  const auto allowed = table.find(method);
  if (allowed == table.end() || allowed->second.count(role) == 0) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("role ", RoleName(role), " may not call ", method));
  }
  return grpc::Status::OK;
}

}  // namespace rollpack
