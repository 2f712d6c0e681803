// One client connection's TLS, ended by the HTTP/2 guard itself on a TLS port
// without client certificates (server/ops/h2_guard.h): OpenSSL on the
// client's non-blocking socket, driven by the guard's relay loop
// (server/ops/h2_relay_loop.h), which reads and writes the plaintext through
// Recv and Send as it reads and writes a plaintext port's socket.
//
// OpenSSL holds at most one record (16 KiB and its overhead) per direction
// per connection, and gives both buffers back while the connection is quiet
// (SSL_MODE_RELEASE_BUFFERS).
#ifndef ROLLPACK_SERVER_OPS_H2_TLS_STREAM_H_
#define ROLLPACK_SERVER_OPS_H2_TLS_STREAM_H_

#include <sys/types.h>

#include <cstddef>
#include <string>

typedef struct ssl_st SSL;

namespace rollpack {

class H2TlsStream {
 public:
  enum class Step { kDone, kWantRead, kWantWrite, kFailed };

  // Takes `ssl`, already bound to its socket in the server's role.
  explicit H2TlsStream(SSL* ssl) : ssl_(ssl) {}
  ~H2TlsStream();

  H2TlsStream(const H2TlsStream&) = delete;
  H2TlsStream& operator=(const H2TlsStream&) = delete;

  // Moves the handshake on as far as the socket allows. kWantRead: wait for
  // the client's bytes; kWantWrite: for the socket to drain; kFailed: the
  // connection cannot go on (failure() says why).
  Step Handshake();
  bool established() const { return established_; }
  // Why the handshake or the connection failed, for logs.
  const std::string& failure() const { return failure_; }

  // recv(2) and send(2) of the plaintext, once established: bytes moved; 0
  // from Recv at the client's end (close_notify or the TCP end); -1 with
  // errno EAGAIN when the socket has nothing for now or is full, EPROTO on
  // a TLS error, or the socket's own error.
  ssize_t Recv(char* buffer, size_t size);
  ssize_t Send(const char* buffer, size_t size);

  // Sends close_notify if the socket takes it now (a client does not wait
  // for it: the relay then ends the socket's sending side).
  void SendCloseNotify();

 private:
  // errno for SSL_get_error's `error`; records a TLS failure.
  int ErrnoFor(int error);

  SSL* const ssl_;
  bool established_ = false;
  std::string failure_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_TLS_STREAM_H_
