// Follows one direction of an HTTP/2 connection frame by frame, reading only
// the 9-byte frame headers (RFC 9113 section 4.1), so that a relay can count
// what a peer does without decoding it (server/ops/h2_guard.h).
#ifndef ROLLPACK_SERVER_OPS_H2_FRAME_WATCH_H_
#define ROLLPACK_SERVER_OPS_H2_FRAME_WATCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/ops/h2_open_streams.h"

namespace rollpack {

// What one chunk of a direction held.
struct H2FrameTally {
  // HEADERS frames that open a stream (a stream id above every one before).
  int64_t streams_opened = 0;
  // RST_STREAM frames of streams the server may still be working on (with
  // no H2OpenStreams: every RST_STREAM frame).
  int64_t streams_reset = 0;
  // RST_STREAM frames of streams the server already ended, or the client
  // reset before (server/ops/h2_open_streams.h): not rapid reset.
  int64_t resets_of_ended_streams = 0;
};

// What a caller that needs more than counts is told, frame by frame
// (server/ops/h2_token_check.h). A non-OK status fails the watch.
class H2FrameObserver {
 public:
  virtual ~H2FrameObserver() = default;
  // A whole header block (HEADERS and its CONTINUATIONs, padding and
  // priority fields taken out) of `stream`, in the order they came;
  // `end_stream`: the HEADERS frame ended the client's side of the stream.
  virtual absl::Status OnHeaderBlock(uint32_t stream, absl::string_view block,
                                     bool end_stream) = 0;
  // A DATA frame of `length` bytes (padding included) on `stream`;
  // `end_stream`: the client's last on it.
  virtual absl::Status OnData(uint32_t stream, uint32_t length, bool end_stream) = 0;
  // `stream` ended for good: RST_STREAM (either side), or the server's
  // END_STREAM (its trailers). Only this is reported from the server's
  // direction (its header blocks use the server's HPACK table).
  virtual void OnStreamEnded(uint32_t stream) = 0;
};

// Feed it the bytes of one direction in order, in chunks of any size. The
// bytes themselves are not kept: the caller forwards them unchanged.
//
// The client's direction starts with the connection preface; anything else
// is not HTTP/2 and is refused. On that side a header block (HEADERS and its
// CONTINUATION frames) larger than `max_header_block_bytes` is refused as
// well (a CONTINUATION flood makes a server buffer headers without end), and
// so is any other frame inside an open header block (RFC 9113 section 6.10).
class H2FrameWatch {
 public:
  enum class Direction { kFromClient, kFromServer };

  // 64 KiB: gRPC refuses a header list over 8 KiB (its
  // SETTINGS_MAX_HEADER_LIST_SIZE), and HPACK never makes a block much
  // larger than the list it encodes; a flood is far above.
  static constexpr int64_t kDefaultMaxHeaderBlockBytes = int64_t{64} << 10;

  // With an `observer` (not owned), header blocks are kept until complete
  // and handed to it (at most max_header_block_bytes each). With `streams`
  // (not owned; the two watches of a connection share one), the client's
  // watch records the streams it opens and tells the resets of ended ones
  // apart, the server's records the streams it ends.
  explicit H2FrameWatch(Direction direction,
                        int64_t max_header_block_bytes = kDefaultMaxHeaderBlockBytes,
                        H2FrameObserver* observer = nullptr, H2OpenStreams* streams = nullptr);

  // INVALID_ARGUMENT: not an HTTP/2 client preface; RESOURCE_EXHAUSTED: a
  // header block over the bound. After an error the watch stays failed.
  absl::StatusOr<H2FrameTally> Feed(absl::string_view bytes);

  // Whether every byte fed so far ends a frame (or the preface): a frame of
  // our own may be written to this direction here.
  bool at_frame_boundary() const;

  // The highest stream id a HEADERS frame opened: the last_stream_id of a
  // GOAWAY sent in the other direction.
  uint32_t highest_stream_id() const { return highest_stream_id_; }

 private:
  absl::Status FrameHeaderComplete(H2FrameTally& tally);
  // The payload of a HEADERS or CONTINUATION frame is complete in
  // frame_payload_: its fragment joins the block, handed over at its end.
  absl::Status HeaderPayloadComplete();

  Direction direction_;
  int64_t max_header_block_bytes_;
  size_t preface_left_;
  unsigned char header_[9];
  size_t header_have_ = 0;
  uint32_t payload_left_ = 0;
  // A header block is open (END_HEADERS not yet seen) and has this many bytes.
  bool in_header_block_ = false;
  uint32_t block_stream_ = 0;
  int64_t header_block_bytes_ = 0;
  uint32_t highest_stream_id_ = 0;
  bool failed_ = false;

  H2FrameObserver* observer_;
  H2OpenStreams* streams_;
  // With an observer: the frame being read carries a header fragment.
  bool keeping_payload_ = false;
  uint8_t frame_type_ = 0;
  uint8_t frame_flags_ = 0;
  bool payload_is_headers_ = false;
  bool block_ends_stream_ = false;
  uint32_t frame_stream_ = 0;
  std::string frame_payload_;
  std::string header_block_;
};

// A GOAWAY frame (RFC 9113 section 6.8) with ENHANCE_YOUR_CALM and `debug`
// as its debug data, for a server to write at a frame boundary.
std::string EnhanceYourCalmGoaway(uint32_t last_stream_id, absl::string_view debug);

// The same with PROTOCOL_ERROR: the answer to a connection that is not
// HTTP/2 (RFC 9113 section 3.4). It also tells a TLS client at once that
// this port is plaintext: its bytes are no TLS record ("wrong version
// number"), where a bare close would look like a network fault worth
// retrying.
std::string ProtocolErrorGoaway(absl::string_view debug);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_H2_FRAME_WATCH_H_
