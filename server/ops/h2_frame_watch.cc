#include "server/ops/h2_frame_watch.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

// RFC 9113 section 3.4.
constexpr absl::string_view kClientPreface("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);

// RFC 9113 section 6: frame types and flags the watch follows.
constexpr uint8_t kData = 0x0;
constexpr uint8_t kHeaders = 0x1;
constexpr uint8_t kRstStream = 0x3;
constexpr uint8_t kPushPromise = 0x5;
constexpr uint8_t kGoaway = 0x7;
constexpr uint8_t kContinuation = 0x9;
constexpr uint8_t kEndStream = 0x1;
constexpr uint8_t kEndHeaders = 0x4;
constexpr uint8_t kPadded = 0x8;
constexpr uint8_t kPriority = 0x20;
constexpr uint32_t kEnhanceYourCalm = 0xb;
constexpr uint32_t kProtocolError = 0x1;

}  // namespace

H2FrameWatch::H2FrameWatch(Direction direction, int64_t max_header_block_bytes,
                           H2FrameObserver* observer, H2OpenStreams* streams)
    : direction_(direction),
      max_header_block_bytes_(max_header_block_bytes),
      preface_left_(direction == Direction::kFromClient ? kClientPreface.size() : 0),
      observer_(observer),
      streams_(streams) {}

bool H2FrameWatch::at_frame_boundary() const {
  return !failed_ && header_have_ == 0 && payload_left_ == 0 &&
         (preface_left_ == 0 || preface_left_ == kClientPreface.size());
}

absl::StatusOr<H2FrameTally> H2FrameWatch::Feed(absl::string_view bytes) {
  if (failed_) return absl::FailedPreconditionError("the HTTP/2 stream already failed");
  H2FrameTally tally;
  while (!bytes.empty()) {
    if (preface_left_ > 0) {
      const size_t offset = kClientPreface.size() - preface_left_;
      const size_t n = std::min(preface_left_, bytes.size());
      if (bytes.substr(0, n) != kClientPreface.substr(offset, n)) {
        failed_ = true;
        return absl::InvalidArgumentError(
            "the connection does not start with the HTTP/2 client preface (RFC 9113 3.4)");
      }
      preface_left_ -= n;
      bytes.remove_prefix(n);
      continue;
    }
    if (payload_left_ > 0) {
      const size_t n = std::min<size_t>(payload_left_, bytes.size());
      if (keeping_payload_) frame_payload_.append(bytes.data(), n);
      payload_left_ -= static_cast<uint32_t>(n);
      bytes.remove_prefix(n);
      if (payload_left_ == 0 && keeping_payload_) {
        absl::Status status = HeaderPayloadComplete();
        if (!status.ok()) {
          failed_ = true;
          return status;
        }
      }
      continue;
    }
    const size_t n = std::min(sizeof(header_) - header_have_, bytes.size());
    std::memcpy(header_ + header_have_, bytes.data(), n);
    header_have_ += n;
    bytes.remove_prefix(n);
    if (header_have_ == sizeof(header_)) {
      header_have_ = 0;
      absl::Status status = FrameHeaderComplete(tally);
      if (status.ok() && keeping_payload_ && payload_left_ == 0) status = HeaderPayloadComplete();
      if (!status.ok()) {
        failed_ = true;
        return status;
      }
    }
  }
  return tally;
}

absl::Status H2FrameWatch::FrameHeaderComplete(H2FrameTally& tally) {
  const uint32_t length = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
  const uint8_t type = header_[3];
  const uint8_t flags = header_[4];
  const uint32_t stream_id = ((uint32_t{header_[5]} << 24) | (uint32_t{header_[6]} << 16) |
                              (uint32_t{header_[7]} << 8) | header_[8]) &
                             0x7fffffffu;
  payload_left_ = length;
  const bool from_client = direction_ == Direction::kFromClient;
  if (from_client && in_header_block_ && type != kContinuation) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a frame of type ", static_cast<int>(type), " inside the header block of stream ",
        block_stream_));
  }
  if (type == kHeaders || type == kPushPromise) {
    block_stream_ = stream_id;
    if (type == kHeaders && stream_id > highest_stream_id_) {
      highest_stream_id_ = stream_id;
      ++tally.streams_opened;
      if (from_client && streams_ != nullptr) streams_->Opened(stream_id);
    }
    in_header_block_ = (flags & kEndHeaders) == 0;
    header_block_bytes_ = length;
  } else if (type == kContinuation && in_header_block_) {
    header_block_bytes_ += length;
    in_header_block_ = (flags & kEndHeaders) == 0;
  } else if (type == kRstStream) {
    // Classified before the reset ends the stream: a reset repeated is free.
    const bool ended = from_client && streams_ != nullptr && !streams_->MayBeOpen(stream_id);
    ++(ended ? tally.resets_of_ended_streams : tally.streams_reset);
  }
  // The server's END_STREAM ends a stream for it, trailers or not (a
  // HEADERS frame's flag holds even if CONTINUATIONs follow); so does a
  // reset either way. Recorded before the bytes go on: a client can only
  // answer an end after the relay saw it.
  if (streams_ != nullptr &&
      (type == kRstStream ||
       (!from_client && (type == kHeaders || type == kData) && (flags & kEndStream) != 0))) {
    streams_->Ended(stream_id);
  }
  if (from_client && header_block_bytes_ > max_header_block_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a header block of ", header_block_bytes_, " bytes on stream ", stream_id,
                     " is over the bound of ", max_header_block_bytes_, " bytes"));
  }
  if (type != kHeaders && type != kPushPromise && type != kContinuation) header_block_bytes_ = 0;
  if (observer_ != nullptr && !from_client) {
    if (type == kRstStream || (type == kHeaders && (flags & kEndStream) != 0) ||
        (type == kData && (flags & kEndStream) != 0)) {
      observer_->OnStreamEnded(stream_id);
    }
    return absl::OkStatus();
  }
  if (observer_ != nullptr && type == kRstStream) observer_->OnStreamEnded(stream_id);
  keeping_payload_ = observer_ != nullptr &&
                     (type == kHeaders || (type == kContinuation && frame_type_ == kHeaders &&
                                           frame_stream_ == stream_id));
  if (keeping_payload_) {
    if (type == kHeaders) {
      frame_type_ = type;
      frame_stream_ = stream_id;
      block_ends_stream_ = (flags & kEndStream) != 0;
      header_block_.clear();
    }
    frame_flags_ = flags;
    payload_is_headers_ = type == kHeaders;
    frame_payload_.clear();
  } else if (observer_ != nullptr) {
    frame_type_ = type;
    if (type == kData) return observer_->OnData(stream_id, length, (flags & kEndStream) != 0);
  }
  return absl::OkStatus();
}

absl::Status H2FrameWatch::HeaderPayloadComplete() {
  keeping_payload_ = false;
  absl::string_view fragment = frame_payload_;
  // RFC 9113 section 6.2: HEADERS may carry a pad length and a priority
  // before the fragment, and padding after it.
  if (payload_is_headers_) {
    size_t pad = 0;
    if ((frame_flags_ & kPadded) != 0) {
      if (fragment.empty()) return absl::InvalidArgumentError("a padded HEADERS frame is empty");
      pad = static_cast<uint8_t>(fragment[0]);
      fragment.remove_prefix(1);
    }
    if ((frame_flags_ & kPriority) != 0) {
      if (fragment.size() < 5) return absl::InvalidArgumentError("a HEADERS priority is cut short");
      fragment.remove_prefix(5);
    }
    if (pad > fragment.size()) return absl::InvalidArgumentError("HEADERS padding past its frame");
    fragment.remove_suffix(pad);
  }
  header_block_.append(fragment.data(), fragment.size());
  if ((frame_flags_ & kEndHeaders) == 0) return absl::OkStatus();
  frame_type_ = 0;
  absl::Status status = observer_->OnHeaderBlock(frame_stream_, header_block_, block_ends_stream_);
  // A block is a few hundred bytes; one near the bound keeps no memory.
  if (header_block_.capacity() > 4096) std::string().swap(header_block_);
  if (frame_payload_.capacity() > 4096) std::string().swap(frame_payload_);
  header_block_.clear();
  return status;
}

namespace {

std::string Goaway(uint32_t error_code, uint32_t last_stream_id, absl::string_view debug) {
  const uint32_t length = 8 + static_cast<uint32_t>(debug.size());
  std::string frame;
  frame.reserve(9 + length);
  frame.push_back(static_cast<char>(length >> 16));
  frame.push_back(static_cast<char>(length >> 8));
  frame.push_back(static_cast<char>(length));
  frame.push_back(static_cast<char>(kGoaway));
  frame.push_back(0);  // flags
  frame.append(4, '\0');  // stream 0
  for (int shift = 24; shift >= 0; shift -= 8) {
    frame.push_back(static_cast<char>((last_stream_id & 0x7fffffffu) >> shift));
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    frame.push_back(static_cast<char>(error_code >> shift));
  }
  frame.append(debug.data(), debug.size());
  return frame;
}

}  // namespace

std::string EnhanceYourCalmGoaway(uint32_t last_stream_id, absl::string_view debug) {
  return Goaway(kEnhanceYourCalm, last_stream_id, debug);
}

std::string ProtocolErrorGoaway(absl::string_view debug) {
  return Goaway(kProtocolError, 0, debug);
}

}  // namespace rollpack
