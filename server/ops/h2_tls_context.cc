#include "server/ops/h2_tls_context.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/ops/watched_tls.h"

namespace rollpack {
namespace {

// gRPC's TLS 1.2 suites (its ssl_transport_security.cc): forward secret,
// AEAD, none of those RFC 9113 appendix A forbids for HTTP/2. TLS 1.3
// suites are OpenSSL's defaults, all of them allowed.
constexpr char kTls12Ciphers[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384";

using ContextPtr = std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)>;
using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

std::string OpenSslErrors() {
  std::string text;
  while (const unsigned long error = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(error, line, sizeof(line));
    absl::StrAppend(&text, text.empty() ? "" : "; ", line);
  }
  return text;
}

// "h2" or a fatal no_application_protocol alert. A client that offers no
// protocol at all is let through: its first bytes show whether it speaks
// HTTP/2 (the frame watch closes it otherwise).
int SelectH2(SSL* /*ssl*/, const unsigned char** out, unsigned char* out_size,
             const unsigned char* offered, unsigned int offered_size, void* /*arg*/) {
  static const unsigned char kH2[] = {2, 'h', '2'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, out_size, kH2, sizeof(kH2), offered, offered_size) !=
      OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

BioPtr MemoryBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
}

absl::StatusOr<ContextPtr> BuildContext(const std::string& cert_pem, const std::string& key_pem,
                                        const std::string& cert_path,
                                        const std::string& key_path) {
  ERR_clear_error();
  ContextPtr ctx(SSL_CTX_new(TLS_server_method()), &SSL_CTX_free);
  if (ctx == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("SSL_CTX_new: ", OpenSslErrors()));
  }
  SSL_CTX* c = ctx.get();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET | SSL_OP_NO_COMPRESSION |
                             SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_num_tickets(c, 0);
  SSL_CTX_set_session_cache_mode(c, SSL_SESS_CACHE_OFF);
  // The relay writes from a buffer that fills while a write waits, and
  // takes partial writes as send(2)'s.
  SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                          SSL_MODE_RELEASE_BUFFERS);
  if (SSL_CTX_set_cipher_list(c, kTls12Ciphers) != 1) {
    return absl::InternalError(absl::StrCat("SSL_CTX_set_cipher_list: ", OpenSslErrors()));
  }
  SSL_CTX_set_verify(c, SSL_VERIFY_NONE, nullptr);
  SSL_CTX_set_alpn_select_cb(c, &SelectH2, nullptr);

  BioPtr chain = MemoryBio(cert_pem);
  X509* leaf = PEM_read_bio_X509_AUX(chain.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", cert_path,
                                                   " holds no certificate: ", OpenSslErrors()));
  }
  const int used = SSL_CTX_use_certificate(c, leaf);
  X509_free(leaf);
  if (used != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert ", cert_path, ": ", OpenSslErrors()));
  }
  while (X509* issuer = PEM_read_bio_X509(chain.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(c, issuer) != 1) {
      X509_free(issuer);
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert ", cert_path, ": its chain: ", OpenSslErrors()));
    }
  }
  ERR_clear_error();  // the end of the chain reads as an error
  BioPtr key_bio = MemoryBio(key_pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", key_path,
                                                   " holds no private key: ", OpenSslErrors()));
  }
  const int key_used = SSL_CTX_use_PrivateKey(c, key);
  EVP_PKEY_free(key);
  if (key_used != 1 || SSL_CTX_check_private_key(c) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", key_path,
                                                   " is not the key of --tls-cert ", cert_path,
                                                   ": ", OpenSslErrors()));
  }
  return ctx;
}

}  // namespace

absl::StatusOr<std::shared_ptr<H2TlsContext>> H2TlsContext::Create(std::string cert_path,
                                                                   std::string key_path,
                                                                   absl::Duration refresh) {
  std::shared_ptr<H2TlsContext> context(
      new H2TlsContext(std::move(cert_path), std::move(key_path), refresh));
  absl::MutexLock lock(&context->mu_);
  RETURN_IF_ERROR(context->Refresh(absl::Now()));
  return context;
}

H2TlsContext::~H2TlsContext() {
  absl::MutexLock lock(&mu_);
  SSL_CTX_free(ctx_);
}

absl::Status H2TlsContext::Refresh(absl::Time now) {
  if (ctx_ != nullptr && now - checked_ < refresh_) return absl::OkStatus();
  checked_ = now;
  ASSIGN_OR_RETURN(std::string cert_pem, ReadPemFile(cert_path_, "--tls-cert"));
  ASSIGN_OR_RETURN(std::string key_pem, ReadPemFile(key_path_, "--tls-key"));
  if (ctx_ != nullptr && cert_pem == cert_pem_ && key_pem == key_pem_) return absl::OkStatus();
  ASSIGN_OR_RETURN(ContextPtr ctx, BuildContext(cert_pem, key_pem, cert_path_, key_path_));
  if (ctx_ != nullptr) {
    spdlog::info("h2 guard: new TLS handshakes use the certificate now in {}", cert_path_);
  }
  SSL_CTX_free(ctx_);  // sessions made from it hold their own reference
  ctx_ = ctx.release();
  cert_pem_ = std::move(cert_pem);
  key_pem_ = std::move(key_pem);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<H2TlsStream>> H2TlsContext::NewStream(int fd, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (absl::Status refreshed = Refresh(now); !refreshed.ok()) {
    // At most once per refresh: checked_ moved on.
    spdlog::error("h2 guard: keeping the TLS certificate in use: {}", refreshed.ToString());
  }
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("SSL_new: ", OpenSslErrors()));
  }
  if (SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return absl::ResourceExhaustedError(absl::StrCat("SSL_set_fd: ", OpenSslErrors()));
  }
  SSL_set_accept_state(ssl);
  return std::make_unique<H2TlsStream>(ssl);
}

}  // namespace rollpack
