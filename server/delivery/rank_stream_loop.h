// The encode-and-write loop of one trainer rank's stream, apart from the
// transport that carries it: which micro-batch goes next (a piece stream
// skips those without rows of its member), its encoding into a buffer the
// writer provides, and the hand-over of those bytes; the next micro-batch is
// encoded while one is on the wire when the writer allows it. It exists once:
// FetchReactor (trainer_service.cc) is its gRPC writer and keeps the call's
// shape, the send budget, the first-delivery gate and the timers; tests
// drive it with a writer of their own (rank_stream_loop_test.cc).
#ifndef ROLLPACK_SERVER_DELIVERY_RANK_STREAM_LOOP_H_
#define ROLLPACK_SERVER_DELIVERY_RANK_STREAM_LOOP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/delivery/microbatch_encoder.h"
#include "server/store/step.h"

namespace rollpack {

// What a RankStreamLoop writes through. Called on whichever thread drives
// the loop, never concurrently for one stream.
class MicrobatchWriter {
 public:
  // Memory for one encoded micro-batch, writable until given to Send.
  class Buffer {
   public:
    virtual ~Buffer() = default;
    virtual absl::Span<char> bytes() = 0;
  };
  enum class Admission {
    kNow,    // go on
    kLater,  // `resume` runs once the bytes are granted (on any thread)
    kNever,  // the stream is over (its client left): the loop stops
  };

  virtual ~MicrobatchWriter() = default;

  // Exactly `size` bytes.
  virtual std::unique_ptr<Buffer> NewBuffer(size_t size) = 0;
  // Asked before the bytes of a micro-batch exist (it is sized, not yet
  // encoded); not asked for one encoded ahead (see encode_ahead).
  // `resume` may end the stream at once on another thread: the loop touches
  // nothing of it after a kLater.
  virtual Admission Admit(int64_t size, absl::AnyInvocable<void()> resume) = 0;
  // Hands one encoded micro-batch to the transport; its completion comes
  // back through RankStreamLoop::OnWriteDone.
  virtual void Send(std::unique_ptr<Buffer> buffer) = 0;
  // The bookkeeping of a completed write (`ok`: the transport took it).
  // True: the loop writes the next micro-batch now. False: the stream ended
  // (and may be gone), or waits and is resumed by RankStreamLoop::WriteNext.
  virtual bool AfterWrite(bool ok) = 0;
  // The loop is done: OK after the last micro-batch, else the error that
  // ended it (an encoding's, or CANCELLED from kNever). Called once; the
  // writer may be gone when it returns.
  virtual void EndStream(const absl::Status& status) = 0;
};

// Which micro-batches of which step one stream sends.
struct RankStreamSource {
  std::shared_ptr<const Step> step;
  // samples->at(i) is the step's sequence i; null: step->samples.
  std::shared_ptr<const std::vector<std::shared_ptr<const StoredSample>>> samples;
  // R2 routing of a RECOMPUTE step whose plan holds none; null: the step's.
  std::shared_ptr<const std::vector<std::shared_ptr<const std::string>>> recompute_routing;
  RankCoords rank;
  int start_index = 0;
  bool all_fields = false;
  // FetchPieces: this member's rows only; null: whole micro-batches. Must
  // outlive the loop.
  const PieceSelection* piece = nullptr;
  // Encode micro-batch i + 1 while i is written, so one stream is not idle
  // for the encoding between two writes. Only when the writer admits every
  // size at once (no send budget): a micro-batch encoded ahead is not
  // admitted.
  bool encode_ahead = false;
};

class RankStreamLoop {
 public:
  explicit RankStreamLoop(MicrobatchWriter* writer) : writer_(writer) {}
  RankStreamLoop(const RankStreamLoop&) = delete;
  RankStreamLoop& operator=(const RankStreamLoop&) = delete;

  // OUT_OF_RANGE when source.start_index is not in [0, micro-batches]; the
  // loop then never writes. Call once, then WriteNext.
  absl::Status Start(RankStreamSource source);

  // Writes the next micro-batch (or finishes the stream). The loop's entry:
  // after Start, and to resume a stream that AfterWrite held back.
  void WriteNext();
  // The transport completed the last Send.
  void OnWriteDone(bool ok);

  // The index of the next micro-batch to encode.
  int next_index() const { return next_; }
  // Whether a micro-batch is left to write (the one encoded ahead included):
  // false once the last one was sent.
  bool more_to_write();
  int num_microbatches() const;

 private:
  // With `size` bytes admitted: encodes the prepared micro-batch, writes it.
  void EncodeAndWrite();
  void SendAndEncodeAhead(std::unique_ptr<MicrobatchWriter::Buffer> buffer);
  // Prepares the next micro-batch with rows of this stream; false at the end.
  absl::StatusOr<bool> PrepareNext();
  // Encodes the prepared micro-batch into a new buffer; moves next_ on.
  absl::StatusOr<std::unique_ptr<MicrobatchWriter::Buffer>> EncodePrepared();
  // Encodes the next micro-batch into ahead_buffer_. False when there is
  // none or it fails: WriteNext then prepares it again and reports the
  // error in order.
  bool EncodeAhead();
  // The micro-batch encoded ahead, if any.
  std::unique_ptr<MicrobatchWriter::Buffer> TakeAhead();
  MicrobatchRequest Request() const;
  absl::Status Prepare();

  MicrobatchWriter* const writer_;
  RankStreamSource source_;
  int next_ = 0;
  MicrobatchEncoder encoder_;
  // The micro-batch encoded while the previous one is written.
  enum class Ahead { kNone, kEncoding, kReady };
  absl::Mutex ahead_mu_;
  Ahead ahead_ ABSL_GUARDED_BY(ahead_mu_) = Ahead::kNone;
  // OnWriteDone's `ok` (1 or 0) when it came during kEncoding; -1: not yet.
  int write_done_while_encoding_ ABSL_GUARDED_BY(ahead_mu_) = -1;
  std::unique_ptr<MicrobatchWriter::Buffer> ahead_buffer_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_RANK_STREAM_LOOP_H_
