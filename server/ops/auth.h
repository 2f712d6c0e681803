// Token authentication with roles, checked at the top of every rollpack RPC
// handler (so it works on insecure and TLS ports alike).
//
// Clients send `authorization: Bearer <token>` metadata (the Python
// Producer's `token=` option does). Tokens come from a file
// (--auth-tokens FILE), one `ROLE TOKEN` pair per line, `#` comments:
//
//   producer 3f1c...   # rollout workers: RegisterModel, PutSamples, AnnotateSamples, GetPool
//   trainer  9a7e...   # trainers: CreateStep, GetPlan, FetchMicrobatches, GetPool,
//                      #   Rendezvous.ExchangeId, Telemetry.ReportRoutingAgreement
//   admin    c02b...   # everything; the only role that may ReleaseStep,
//                      #   DeletePool and operate the cluster (ClusterAdmin:
//                      #   status, drain)
//
// No token file = auth off (every call allowed). With one: no or malformed
// metadata or an unknown token -> UNAUTHENTICATED; a known token whose role
// may not call the method -> PERMISSION_DENIED. The health service and
// server reflection stay open (probes and grpcurl/buf need them; reflection
// exposes the schema, not data).
//
// Cluster members (docs/cluster.md, "Threat model") authenticate by
// certificate, not token: with a member identity set (mutual TLS in cluster
// mode), a peer whose verified client certificate has that Common Name has
// the member role, and the Member service answers nobody else, whatever
// token they send. Members hold no token: the role is not in the file.
#ifndef ROLLPACK_SERVER_OPS_AUTH_H_
#define ROLLPACK_SERVER_OPS_AUTH_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace rollpack {

enum class Role { kProducer, kTrainer, kAdmin, kMember };

const char* RoleName(Role role);

// Full method name -> roles that may call it. Methods not listed are denied
// to everyone when auth is on.
const std::map<std::string, std::set<Role>>& MethodRoles();

class Authorizer {
 public:
  // Auth off: Check() allows everything.
  Authorizer() = default;

  // Parses `ROLE TOKEN` lines. INVALID_ARGUMENT (with the line number) for
  // an unknown role, a line without exactly two fields, a token shorter than
  // 16 characters or one listed twice.
  static absl::StatusOr<Authorizer> Parse(const std::string& text);
  static absl::StatusOr<Authorizer> FromFile(const std::string& path);

  // Whether tokens are checked.
  bool enabled() const { return !tokens()->empty(); }
  size_t num_tokens() const { return tokens()->size(); }

  // Takes the tokens of `path` in place of the ones held, for calls that
  // start from now on (rollpackd re-reads --auth-tokens on SIGHUP); the old
  // ones stay when the file does not parse or holds none.
  absl::Status ReloadTokens(const std::string& path);

  // Peers whose verified client certificate has Common Name `common_name`
  // are cluster members (empty: no peer is; the Member service is then open
  // to whoever reaches it, as on a trusted network).
  void set_member_identity(std::string common_name) {
    member_identity_ = std::move(common_name);
  }
  const std::string& member_identity() const { return member_identity_; }
  // Whether `peer` proved the member identity with a verified certificate.
  bool IsMember(const grpc::AuthContext& peer) const;

  // OK, UNAUTHENTICATED or PERMISSION_DENIED for a call of `method`
  // ("/rollpack.v1.Scheduler/ReleaseStep") with the context's metadata and
  // its peer's certificate.
  grpc::Status Check(const grpc::ServerContextBase& context, const std::string& method) const;
  // The one rule: `authorization` is the header's raw value (empty =
  // missing), `peer` the connection's (null: no certificate).
  grpc::Status CheckCall(const std::string& authorization, const grpc::AuthContext* peer,
                         const std::string& method) const;
  // The same for a caller without a certificate.
  grpc::Status CheckHeader(const std::string& authorization, const std::string& method) const;

  // OK and the token's role when `authorization` is `Bearer <known token>`;
  // UNAUTHENTICATED otherwise (auth on only).
  grpc::Status Authenticate(const std::string& authorization, Role* role) const;

  // Who sent `authorization`, for logs: the role's name, "no token" or
  // "unknown token"; empty when auth is off. Never the token itself.
  std::string RoleOf(const std::string& authorization) const;

 private:
  struct Entry {
    std::string token;
    Role role;
  };
  using Tokens = std::vector<Entry>;
  std::shared_ptr<const Tokens> tokens() const { return std::atomic_load(&tokens_); }

  // Swapped whole by ReloadTokens while calls read it.
  std::shared_ptr<const Tokens> tokens_ = std::make_shared<const Tokens>();
  std::string member_identity_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_AUTH_H_
