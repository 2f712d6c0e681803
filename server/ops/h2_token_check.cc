#include "server/ops/h2_token_check.h"

#include <nghttp2/nghttp2.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/ops/token_gate.h"

namespace rollpack {
namespace {

nghttp2_hd_inflater* NewInflater() {
  nghttp2_hd_inflater* inflater = nullptr;
  if (nghttp2_hd_inflate_new(&inflater) != 0) return nullptr;
  // The client's encoder is bounded by what gRPC announces (4 KiB unless
  // --grpc-arg changes it), and gRPC closes a connection past it; a larger
  // bound here never refuses what gRPC takes.
  nghttp2_hd_inflate_change_table_size(inflater, 64 << 10);
  return inflater;
}

}  // namespace

H2TokenCheck::H2TokenCheck(const Authorizer* auth)
    : auth_(auth), inflater_(NewInflater(), &nghttp2_hd_inflate_del) {}

H2TokenCheck::~H2TokenCheck() = default;

absl::Status H2TokenCheck::OnHeaderBlock(uint32_t stream, absl::string_view block,
                                         bool end_stream) {
  if (inflater_ == nullptr) return absl::ResourceExhaustedError("no memory for an HPACK decoder");
  std::string path;
  std::string authorization;
  bool seen_authorization = false;
  const auto* in = reinterpret_cast<const uint8_t*>(block.data());
  size_t left = block.size();
  for (;;) {
    nghttp2_nv nv;
    int flags = 0;
    const ssize_t used =
        nghttp2_hd_inflate_hd2(inflater_.get(), &nv, &flags, in, left, /*in_final=*/1);
    if (used < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the header block of stream ", stream, " does not decode: ", nghttp2_strerror(used)));
    }
    in += used;
    left -= static_cast<size_t>(used);
    if ((flags & NGHTTP2_HD_INFLATE_EMIT) != 0) {
      const absl::string_view name(reinterpret_cast<const char*>(nv.name), nv.namelen);
      const absl::string_view value(reinterpret_cast<const char*>(nv.value), nv.valuelen);
      if (name == ":path") path.assign(value.data(), value.size());
      // The first, as gRPC hands the handlers and the token gate.
      if (name == "authorization" && !seen_authorization) {
        authorization.assign(value.data(), value.size());
        seen_authorization = true;
      }
    }
    if ((flags & NGHTTP2_HD_INFLATE_FINAL) != 0) {
      nghttp2_hd_inflate_end_headers(inflater_.get());
      break;
    }
    if ((flags & NGHTTP2_HD_INFLATE_EMIT) == 0 && left == 0) break;
  }
  // A block without :path is not a call's start (the client's trailers).
  if (path.empty() && end_stream) OnStreamEnded(stream);
  if (path.empty() || IsOpenMethod(path) || auth_->CheckHeader(authorization, path).ok()) {
    return absl::OkStatus();
  }
  if (end_stream) return absl::OkStatus();  // no request bytes will follow
  if (refused_streams_.size() >= kMaxRefusedCalls) {
    return absl::UnauthenticatedError(
        absl::StrCat(kMaxRefusedCalls, " calls without a valid token are open on the connection"));
  }
  refused_streams_.emplace(stream, 0);
  return absl::OkStatus();
}

absl::Status H2TokenCheck::OnData(uint32_t stream, uint32_t length, bool end_stream) {
  auto it = refused_streams_.find(stream);
  if (it == refused_streams_.end()) return absl::OkStatus();
  it->second += length;
  refused_bytes_ += length;
  if (refused_bytes_ > kRefusedCallBytes) {
    return absl::UnauthenticatedError(
        absl::StrCat("calls without a valid token sent ", refused_bytes_,
                     " request bytes, more than the ", kRefusedCallBytes,
                     " read before their refusal"));
  }
  if (end_stream) OnStreamEnded(stream);
  return absl::OkStatus();
}

void H2TokenCheck::OnStreamEnded(uint32_t stream) {
  auto it = refused_streams_.find(stream);
  if (it == refused_streams_.end()) return;
  refused_bytes_ -= it->second;
  refused_streams_.erase(it);
}

}  // namespace rollpack
