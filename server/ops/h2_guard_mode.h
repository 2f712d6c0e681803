// Whether rollpackd's HTTP/2 guard (server/ops/h2_guard.h) fronts its gRPC
// port: --h2-guard true, false, or auto.
#ifndef ROLLPACK_SERVER_OPS_H2_GUARD_MODE_H_
#define ROLLPACK_SERVER_OPS_H2_GUARD_MODE_H_

#include <string>

namespace rollpack {

enum class H2GuardMode { kAuto, kOn, kOff };

// What ChooseH2Guard decided, and why, for the line rollpackd logs at start.
struct H2GuardChoice {
  bool fronted = false;
  std::string why;
};

// kAuto fronts a port that other hosts reach, and a loopback port when
// --auth-tokens is set: then the port's callers are meant to be
// authenticated, local processes included, and a local process without a
// token must not make rollpackd hold memory (the guard bounds the request
// bytes of its refused calls, its resets, its connections). Without tokens a
// local process may already call every RPC, the destructive ones included:
// the relay's CPU would buy nothing, and the loopback port stays direct.
// `mutual_tls`: gRPC terminates mutual TLS on the port, which is never
// fronted (its handshake refuses unknown peers); a TLS port without client
// certificates is fronted as a plaintext one, the guard ending TLS itself.
H2GuardChoice ChooseH2Guard(H2GuardMode mode, bool mutual_tls, bool loopback, bool auth_tokens);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_GUARD_MODE_H_
