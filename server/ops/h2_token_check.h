// The token check of a plaintext port, made by the HTTP/2 guard before gRPC
// reads a request (server/ops/h2_guard.h). On a TLS port gRPC runs the token
// gate from the call's headers (server/ops/token_gate.h); on a plaintext one
// gRPC 1.51 runs no such hook and reads a unary request whole before its
// handler can refuse it, so a client without a token could make rollpackd
// hold --max-message-bytes per call.
//
// The guard decodes every header block the client sends (HPACK, nghttp2's
// decoder, so its table follows gRPC's) and asks the Authorizer about each
// call's method and `authorization` header. A refused call still reaches
// gRPC, which answers it UNAUTHENTICATED or PERMISSION_DENIED as before; but
// the request bytes of refused calls still being sent on one connection may
// add up to kRefusedCallBytes only: past that the connection is closed
// (GOAWAY), so what such calls make rollpackd hold stays within a megabyte
// per connection instead of --max-message-bytes per call.
#ifndef ROLLPACK_SERVER_OPS_H2_TOKEN_CHECK_H_
#define ROLLPACK_SERVER_OPS_H2_TOKEN_CHECK_H_

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "server/ops/auth.h"
#include "server/ops/h2_frame_watch.h"

struct nghttp2_hd_inflater;

namespace rollpack {

class H2TokenCheck : public H2FrameObserver {
 public:
  // Request bytes (DATA frames) that refused calls of one connection may
  // have sent while open (a call ends with the client's END_STREAM, a reset
  // from either side, or the server's trailers) at any time.
  static constexpr int64_t kRefusedCallBytes = int64_t{1} << 20;
  // Refused calls one connection may have open (not ended) at once.
  static constexpr size_t kMaxRefusedCalls = 1024;

  // `auth` (not owned) must have tokens on.
  explicit H2TokenCheck(const Authorizer* auth);
  ~H2TokenCheck() override;

  // UNAUTHENTICATED once refused calls sent more than allowed (or too many
  // are open); INVALID_ARGUMENT for a header block HPACK cannot decode (gRPC
  // would close the connection for it too).
  absl::Status OnHeaderBlock(uint32_t stream, absl::string_view block, bool end_stream) override;
  absl::Status OnData(uint32_t stream, uint32_t length, bool end_stream) override;
  void OnStreamEnded(uint32_t stream) override;

 private:
  const Authorizer* const auth_;
  std::unique_ptr<nghttp2_hd_inflater, void (*)(nghttp2_hd_inflater*)> inflater_;
  // Refused calls not ended yet -> request bytes they sent.
  absl::flat_hash_map<uint32_t, int64_t> refused_streams_;
  int64_t refused_bytes_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_TOKEN_CHECK_H_
