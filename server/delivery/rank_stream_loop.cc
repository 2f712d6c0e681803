#include "server/delivery/rank_stream_loop.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {

absl::Status RankStreamLoop::Start(RankStreamSource source) {
  const int num = source.step->layout.num_microbatches();
  if (source.start_index < 0 || source.start_index > num) {
    return absl::OutOfRangeError(absl::StrCat("start_index ", source.start_index,
                                              " is outside [0, ", num, "] for step \"",
                                              source.step->step_id, "\""));
  }
  next_ = source.start_index;
  source_ = std::move(source);
  return absl::OkStatus();
}

int RankStreamLoop::num_microbatches() const {
  return source_.step->layout.num_microbatches();
}

bool RankStreamLoop::more_to_write() {
  if (next_ < num_microbatches()) return true;
  absl::MutexLock lock(&ahead_mu_);
  return ahead_ == Ahead::kReady;
}

MicrobatchRequest RankStreamLoop::Request() const {
  MicrobatchRequest request;
  request.rank = source_.rank;
  request.index = next_;
  request.all_fields = source_.all_fields;
  request.piece = source_.piece;
  if (source_.recompute_routing != nullptr) request.recompute_routing = *source_.recompute_routing;
  return request;
}

absl::Status RankStreamLoop::Prepare() {
  const Step& step = *source_.step;
  return encoder_.Prepare(step, Request(),
                          source_.samples != nullptr ? absl::MakeConstSpan(*source_.samples)
                                                     : absl::MakeConstSpan(step.samples));
}

absl::StatusOr<bool> RankStreamLoop::PrepareNext() {
  for (;;) {
    if (next_ >= num_microbatches()) return false;
    RETURN_IF_ERROR(Prepare());
    if (!encoder_.empty_piece()) return true;
    ++next_;  // a piece stream skips micro-batches without rows of this member
  }
}

absl::StatusOr<std::unique_ptr<MicrobatchWriter::Buffer>> RankStreamLoop::EncodePrepared() {
  std::unique_ptr<MicrobatchWriter::Buffer> buffer = writer_->NewBuffer(encoder_.encoded_size());
  RETURN_IF_ERROR(encoder_.Encode(buffer->bytes()));
  ++next_;
  return buffer;
}

void RankStreamLoop::WriteNext() {
  if (std::unique_ptr<MicrobatchWriter::Buffer> ahead = TakeAhead()) {
    SendAndEncodeAhead(std::move(ahead));
    return;
  }
  absl::StatusOr<bool> prepared = PrepareNext();
  if (!prepared.ok()) {
    writer_->EndStream(prepared.status());
    return;
  }
  if (!*prepared) {
    writer_->EndStream(absl::OkStatus());
    return;
  }
  // The bytes are admitted before they exist: a stream that must wait
  // holds nothing meanwhile.
  switch (writer_->Admit(static_cast<int64_t>(encoder_.encoded_size()),
                         [this] { EncodeAndWrite(); })) {
    case MicrobatchWriter::Admission::kNow:
      EncodeAndWrite();
      return;
    case MicrobatchWriter::Admission::kLater:
      return;
    case MicrobatchWriter::Admission::kNever:
      writer_->EndStream(absl::CancelledError("stream closed by the client"));
      return;
  }
}

void RankStreamLoop::EncodeAndWrite() {
  absl::StatusOr<std::unique_ptr<MicrobatchWriter::Buffer>> buffer = EncodePrepared();
  if (!buffer.ok()) {
    writer_->EndStream(buffer.status());
    return;
  }
  SendAndEncodeAhead(*std::move(buffer));
}

// A write that completes during the encoding ahead is carried on here, in a
// loop rather than by recursion.
void RankStreamLoop::SendAndEncodeAhead(std::unique_ptr<MicrobatchWriter::Buffer> buffer) {
  for (;;) {
    const bool ahead = source_.encode_ahead && next_ < num_microbatches();
    if (ahead) {
      absl::MutexLock lock(&ahead_mu_);
      ahead_ = Ahead::kEncoding;
      write_done_while_encoding_ = -1;
    }
    writer_->Send(std::move(buffer));
    if (!ahead) return;
    const bool encoded = EncodeAhead();
    int write_done;
    {
      absl::MutexLock lock(&ahead_mu_);
      ahead_ = encoded ? Ahead::kReady : Ahead::kNone;
      write_done = write_done_while_encoding_;
    }
    if (write_done < 0) return;  // OnWriteDone carries on
    if (!writer_->AfterWrite(write_done == 1)) return;
    buffer = TakeAhead();
    if (buffer == nullptr) {
      WriteNext();  // the end, or the encoding's error in order
      return;
    }
  }
}

void RankStreamLoop::OnWriteDone(bool ok) {
  {
    // The thread that sent this micro-batch may still be encoding the next
    // (SendAndEncodeAhead): it carries on from here when done.
    absl::MutexLock lock(&ahead_mu_);
    if (ahead_ == Ahead::kEncoding) {
      write_done_while_encoding_ = ok ? 1 : 0;
      return;
    }
  }
  if (writer_->AfterWrite(ok)) WriteNext();
}

bool RankStreamLoop::EncodeAhead() {
  const int first = next_;
  absl::StatusOr<bool> prepared = PrepareNext();
  if (!prepared.ok()) {
    next_ = first;
    return false;
  }
  if (!*prepared) return false;  // past the last (empty pieces skipped)
  absl::StatusOr<std::unique_ptr<MicrobatchWriter::Buffer>> buffer = EncodePrepared();
  if (!buffer.ok()) {
    next_ = first;
    return false;
  }
  ahead_buffer_ = *std::move(buffer);
  return true;
}

std::unique_ptr<MicrobatchWriter::Buffer> RankStreamLoop::TakeAhead() {
  {
    absl::MutexLock lock(&ahead_mu_);
    if (ahead_ != Ahead::kReady) return nullptr;
    ahead_ = Ahead::kNone;
  }
  return std::move(ahead_buffer_);
}

}  // namespace rollpack
