#include "server/ops/h2_guard_mode.h"

namespace rollpack {

H2GuardChoice ChooseH2Guard(H2GuardMode mode, bool mutual_tls, bool loopback, bool auth_tokens) {
  if (mutual_tls) {
    return {false, "mutual-TLS ports are never fronted (the handshake refuses unknown peers)"};
  }
  switch (mode) {
    case H2GuardMode::kOn:
      return {true, "--h2-guard=true"};
    case H2GuardMode::kOff:
      return {false, "--h2-guard=false"};
    case H2GuardMode::kAuto:
      break;
  }
  if (!loopback) return {true, "--h2-guard=auto: other hosts can reach the port"};
  if (auth_tokens) {
    return {true, "--h2-guard=auto: a loopback port with --auth-tokens (local callers without "
                  "a token are bounded too)"};
  }
  return {false, "--h2-guard=auto: a loopback port without --auth-tokens (every local caller "
                 "may call every RPC anyway)"};
}

}  // namespace rollpack
