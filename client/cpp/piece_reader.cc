#include "client/cpp/piece_reader.h"

#include <algorithm>
#include <utility>

#include "client/cpp/client.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"

namespace rollpack {
namespace {

constexpr char kFetchPiecesMethod[] = "/rollpack.v1.Trainer/FetchPieces";

}  // namespace

PieceReader::PieceReader(std::shared_ptr<grpc::Channel> channel, const v1::PieceRequest& request,
                         const std::string& auth_token, int capacity)
    : capacity_(std::max(1, capacity)) {
  if (!auth_token.empty()) context_.AddMetadata("authorization", "Bearer " + auth_token);
  thread_ = std::thread([this, channel = std::move(channel), request] { Loop(channel, request); });
}

PieceReader::~PieceReader() {
  Cancel();
  thread_.join();
}

void PieceReader::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  // Before the call starts too: gRPC cancels it as it starts.
  context_.TryCancel();
}

absl::StatusOr<std::optional<ReceivedMicrobatch>> PieceReader::Next() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](PieceReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
        return !r->queue_.empty() || r->done_;
      },
      this));
  if (!queue_.empty()) {
    ReceivedMicrobatch next = std::move(queue_.front());
    queue_.pop_front();
    return std::optional<ReceivedMicrobatch>(std::move(next));
  }
  if (!status_.ok()) return status_;
  return std::optional<ReceivedMicrobatch>();
}

void PieceReader::Loop(std::shared_ptr<grpc::Channel> channel, v1::PieceRequest request) {
  // The generated stub's call, with each response left as received.
  const grpc::internal::RpcMethod method(kFetchPiecesMethod,
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method,
                                                                    &context_, request));
  grpc::ByteBuffer received;
  absl::Status parse_error;
  while (reader->Read(&received)) {
    absl::StatusOr<ReceivedMicrobatch> piece = ReceivedMicrobatch::Parse(received);
    received.Clear();
    if (!piece.ok()) {
      parse_error = piece.status();
      context_.TryCancel();
      break;
    }
    absl::MutexLock lock(&mu_);
    // Back-pressure: wait for room before taking the next message.
    mu_.Await(absl::Condition(
        +[](PieceReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
          return r->cancelled_ || static_cast<int>(r->queue_.size()) < r->capacity_;
        },
        this));
    if (cancelled_) break;
    queue_.push_back(*std::move(piece));
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (!parse_error.ok()) status = absl::InternalError(parse_error.ToString());
  absl::MutexLock lock(&mu_);
  if (cancelled_ && status.ok()) status = absl::CancelledError("piece stream cancelled");
  status_ = status;
  done_ = true;
}

}  // namespace rollpack
