#include "server/ops/watched_tls.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <utility>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace rollpack {
namespace {

absl::Status CheckPem(const std::string& path, const char* what) {
  return ReadPemFile(path, what).status();
}

// The server's certificate (its chain already verified against the CA)
// must carry `identity` as its Common Name.
class IdentityVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit IdentityVerifier(std::string identity) : identity_(std::move(identity)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> /*callback*/,
              grpc::Status* sync_status) override {
    const grpc::string_ref name = request->common_name();
    if (absl::string_view(name.data(), name.size()) == identity_) {
      *sync_status = grpc::Status::OK;
    } else {
      *sync_status = grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          absl::StrCat("the peer's certificate has Common Name \"",
                       absl::string_view(name.data(), name.size()), "\", not \"", identity_,
                       "\""));
    }
    return true;  // answered synchronously
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const std::string identity_;
};

unsigned int Seconds(absl::Duration refresh) {
  return static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(refresh)));
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is not PEM"));
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> WatchedServerCredentials(
    const WatchedTlsFiles& files, absl::Duration refresh) {
  if (absl::Status s = CheckPem(files.cert, "--tls-cert"); !s.ok()) return s;
  if (absl::Status s = CheckPem(files.key, "--tls-key"); !s.ok()) return s;
  if (!files.ca.empty()) {
    if (absl::Status s = CheckPem(files.ca, "--tls-client-ca"); !s.ok()) return s;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, Seconds(refresh));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!files.ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> WatchedChannelCredentials(
    const WatchedTlsFiles& files, absl::Duration refresh, const std::string& peer_identity) {
  if (absl::Status s = CheckPem(files.ca, "CA"); !s.ok()) return s;
  if (!files.cert.empty()) {
    if (absl::Status s = CheckPem(files.cert, "--tls-cert"); !s.ok()) return s;
    if (absl::Status s = CheckPem(files.key, "--tls-key"); !s.ok()) return s;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, Seconds(refresh));
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!files.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  if (peer_identity.empty()) {
    options.set_certificate_verifier(
        std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  } else {
    options.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<IdentityVerifier>(peer_identity));
    // The address dialled is checked by identity, not by name.
    options.set_check_call_host(false);
  }
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace rollpack
