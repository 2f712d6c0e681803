#include "server/ops/h2_tls_stream.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace rollpack {
namespace {

// OpenSSL's queued errors of this thread, oldest first, emptying the queue.
std::string OpenSslErrors() {
  std::string text;
  while (const unsigned long error = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(error, line, sizeof(line));
    if (!text.empty()) text += "; ";
    text += line;
  }
  return text.empty() ? "a TLS error" : text;
}

int AtMostInt(size_t size) { return static_cast<int>(std::min<size_t>(size, INT_MAX)); }

}  // namespace

H2TlsStream::~H2TlsStream() { SSL_free(ssl_); }

H2TlsStream::Step H2TlsStream::Handshake() {
  if (established_) return Step::kDone;
  // SSL_get_error reads this thread's error queue: it must hold this call's only.
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_do_handshake(ssl_);
  if (rc == 1) {
    established_ = true;
    return Step::kDone;
  }
  const int error = SSL_get_error(ssl_, rc);
  if (error == SSL_ERROR_WANT_READ) return Step::kWantRead;
  if (error == SSL_ERROR_WANT_WRITE) return Step::kWantWrite;
  const int err = ErrnoFor(error);
  if (failure_.empty()) {
    failure_ = err == EPIPE ? "the client ended the connection" : std::strerror(err);
  }
  return Step::kFailed;
}

ssize_t H2TlsStream::Recv(char* buffer, size_t size) {
  ERR_clear_error();
  errno = 0;
  const int n = SSL_read(ssl_, buffer, AtMostInt(size));
  if (n > 0) return n;
  const int error = SSL_get_error(ssl_, n);
  // close_notify, or the TCP end without it (SSL_OP_IGNORE_UNEXPECTED_EOF).
  if (error == SSL_ERROR_ZERO_RETURN || (error == SSL_ERROR_SYSCALL && errno == 0)) return 0;
  errno = ErrnoFor(error);
  return -1;
}

ssize_t H2TlsStream::Send(const char* buffer, size_t size) {
  ERR_clear_error();
  errno = 0;
  const int n = SSL_write(ssl_, buffer, AtMostInt(size));
  if (n > 0) return n;
  errno = ErrnoFor(SSL_get_error(ssl_, n));
  return -1;
}

void H2TlsStream::SendCloseNotify() {
  if (!established_) return;
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);
  ERR_clear_error();
}

int H2TlsStream::ErrnoFor(int error) {
  switch (error) {
    // Renegotiation is off and no session tickets are sent, so a read never
    // waits for the socket to drain, nor a write for the client's bytes.
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return EAGAIN;
    case SSL_ERROR_SYSCALL:
      if (errno != 0) return errno;
      failure_ = "the client ended the connection";
      return EPIPE;
    default:
      failure_ = OpenSslErrors();
      return EPROTO;
  }
}

}  // namespace rollpack
