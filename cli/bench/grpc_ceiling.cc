#include "cli/bench/grpc_ceiling.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "cli/flags.h"
#include "grpc/grpc.h"
#include "grpc/slice.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "base/keep_freed_memory.h"
#include "server/server.h"

namespace rollpack {
namespace {

constexpr char kDrainMethod[] = "/rollpack.bench.Sink/Drain";
// Request: the message size and count, as "BYTES COUNT".
constexpr char kSourceMethod[] = "/rollpack.bench.Sink/Source";

// Reads every message and drops it.
class DrainReactor final : public grpc::ServerGenericBidiReactor {
 public:
  DrainReactor() { StartRead(&message_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    message_.Clear();
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer message_;
};

// Reads the request, then writes one shared message (nothing copied per
// write) COUNT times, one write in flight, as rollpackd's fetch does.
class SourceReactor final : public grpc::ServerGenericBidiReactor {
 public:
  SourceReactor() { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (started_) return;  // the end of the requests: the writes go on
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
      return;
    }
    started_ = true;
    std::vector<grpc::Slice> slices;
    std::string text;
    if (request_.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) text.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    int64_t bytes = 0;
    if (std::sscanf(text.c_str(), "%" SCNd64 " %" SCNd64, &bytes, &left_) != 2 || bytes <= 0 ||
        bytes > (int64_t{1} << 30)) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "want \"BYTES COUNT\", 0 < BYTES <= 1 GiB"));
      return;
    }
    grpc_slice raw = grpc_slice_malloc(static_cast<size_t>(bytes));
    std::memset(GRPC_SLICE_START_PTR(raw), 0x5a, GRPC_SLICE_LENGTH(raw));
    grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
    message_ = grpc::ByteBuffer(&slice, 1);
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (left_-- > 0) {
      StartWrite(&message_);
    } else {
      Finish(grpc::Status::OK);
    }
  }

  grpc::ByteBuffer request_;
  grpc::ByteBuffer message_;
  bool started_ = false;
  int64_t left_ = 0;
};

class SinkService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    if (context->method() == kSourceMethod) return new SourceReactor();
    return new DrainReactor();
  }
};

// Asks the source for `count` messages of `bytes` and reads them one at a
// time, as a trainer's stream does, dropping each.
class Reader final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Reader(int64_t bytes, int64_t count) {
    const std::string text = absl::StrCat(bytes, " ", count);
    grpc::Slice slice(text);
    request_ = grpc::ByteBuffer(&slice, 1);
  }

  void Start(grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>* stub) {
    stub->PrepareBidiStreamingCall(&context_, kSourceMethod, grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&message_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    received_ += static_cast<int64_t>(message_.Length());
    message_.Clear();
    StartRead(&message_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  grpc::Status Wait() {
    done_.WaitForNotification();
    return status_;
  }
  int64_t received() const { return received_; }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer message_;
  int64_t received_ = 0;
  grpc::Status status_;
  absl::Notification done_;
};

// One channel per stream, each on a TCP connection of its own.
absl::StatusOr<std::vector<
    std::unique_ptr<grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>>>>
Stubs(const std::string& address, int streams) {
  std::vector<std::unique_ptr<grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>>>
      stubs;
  for (int i = 0; i < streams; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt("rollpack.connection", i);  // a connection of its own
    auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(5)))) {
      return absl::UnavailableError(absl::StrCat("gRPC sink at ", address, " did not answer"));
    }
    stubs.push_back(
        std::make_unique<grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>>(channel));
  }
  return stubs;
}

// Writes the same message (one slice, shared: nothing is copied per write)
// `count` times, one write in flight, as a producer does.
class Sender final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Sender(const grpc::ByteBuffer& message, int64_t count) : message_(message), left_(count) {}

  void Start(grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>* stub) {
    stub->PrepareBidiStreamingCall(&context_, kDrainMethod, grpc::StubOptions(), this);
    WriteNext();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  grpc::Status Wait() {
    done_.WaitForNotification();
    return status_;
  }

 private:
  void WriteNext() {
    if (left_-- > 0) {
      StartWrite(&message_);
    } else {
      StartWritesDone();
    }
  }

  grpc::ClientContext context_;
  grpc::ByteBuffer message_;
  int64_t left_;
  grpc::Status status_;
  absl::Notification done_;
};

// Messages each stream carries: total_bytes between the streams, one at least.
absl::StatusOr<int64_t> MessagesPerStream(const GrpcCeilingOptions& options) {
  if (options.message_bytes <= 0 || options.streams <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("message_bytes ", options.message_bytes,
                                                   " and streams ", options.streams,
                                                   " must be > 0"));
  }
  return std::max<int64_t>(1, options.total_bytes / options.streams / options.message_bytes);
}

}  // namespace

absl::StatusOr<double> MeasureGrpcCeilingGBps(const std::string& address,
                                              const GrpcCeilingOptions& options) {
  ASSIGN_OR_RETURN(const int64_t count, MessagesPerStream(options));
  grpc_slice raw = grpc_slice_malloc(static_cast<size_t>(options.message_bytes));
  std::memset(GRPC_SLICE_START_PTR(raw), 0x5a, GRPC_SLICE_LENGTH(raw));
  const grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
  const grpc::ByteBuffer message(&slice, 1);

  auto stubs = Stubs(address, options.streams);
  if (!stubs.ok()) return stubs.status();
  std::vector<std::unique_ptr<Sender>> senders;
  for (int i = 0; i < options.streams; ++i) senders.push_back(std::make_unique<Sender>(message, count));
  const absl::Time start = absl::Now();
  for (int i = 0; i < options.streams; ++i) senders[i]->Start((*stubs)[i].get());
  grpc::Status failed;
  for (auto& sender : senders) {
    grpc::Status status = sender->Wait();
    if (!status.ok() && failed.ok()) failed = status;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!failed.ok()) {
    return absl::UnavailableError(absl::StrCat("gRPC sink call: ", failed.error_message()));
  }
  return static_cast<double>(count * options.message_bytes) * options.streams / seconds / 1e9;
}

absl::StatusOr<double> MeasureGrpcSourceGBps(const std::string& address,
                                             const GrpcCeilingOptions& options) {
  ASSIGN_OR_RETURN(const int64_t count, MessagesPerStream(options));
  auto stubs = Stubs(address, options.streams);
  if (!stubs.ok()) return stubs.status();
  std::vector<std::unique_ptr<Reader>> readers;
  for (int i = 0; i < options.streams; ++i) {
    readers.push_back(std::make_unique<Reader>(options.message_bytes, count));
  }
  const absl::Time start = absl::Now();
  for (int i = 0; i < options.streams; ++i) readers[i]->Start((*stubs)[i].get());
  int64_t received = 0;
  grpc::Status failed;
  for (auto& reader : readers) {  // every call ends before its reader goes
    grpc::Status status = reader->Wait();
    if (!status.ok() && failed.ok()) failed = status;
    received += reader->received();
  }
  if (!failed.ok()) {
    return absl::UnavailableError(absl::StrCat("gRPC source call: ", failed.error_message()));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (received != count * options.message_bytes * options.streams) {
    return absl::DataLossError(absl::StrCat("gRPC source: received ", received, " bytes of ",
                                            count * options.message_bytes * options.streams));
  }
  return static_cast<double>(received) / seconds / 1e9;
}

int RunGrpcSinkCommand(int argc, char** argv) {
  std::string port_file;
  std::vector<std::string> grpc_args;
  FlagSet flags("rollpack bench grpc-sink",
                "The server half of bench transport's gRPC-alone rows: serves a sink that "
                "drops every message on 127.0.0.1, an ephemeral port, until SIGTERM or SIGINT.");
  flags.String("port-file", &port_file, "Write the port to this file once serving.");
  flags.Repeated("grpc-arg", &grpc_args,
                 "NAME=INTEGER[,NAME=INTEGER...]: server channel arguments, as rollpackd's "
                 "--grpc-arg.");
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  KeepFreedMemory();  // as rollpackd: the same cost of memory on both
  std::vector<std::pair<std::string, int>> int_args;
  for (const std::string& arg : grpc_args) {
    for (absl::string_view item : absl::StrSplit(arg, ',')) {
      absl::StatusOr<std::pair<std::string, int>> parsed = ParseGrpcIntArg(item);
      if (!parsed.ok()) {
        return flags.UsageError(parsed.status().message());  // names the flag and item
      }
      int_args.push_back(*parsed);
    }
  }
  // Blocked before any thread starts, so every thread inherits the mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  SinkService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  for (const auto& [name, value] : int_args) builder.AddChannelArgument(name, value);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "rollpack bench grpc-sink: cannot listen\n");
    return 1;
  }
  if (!port_file.empty()) {
    const std::string temporary = port_file + ".tmp";
    std::ofstream(temporary) << port << "\n";
    std::rename(temporary.c_str(), port_file.c_str());
  }
  int signal = 0;
  sigwait(&stop, &signal);
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  return 0;
}

}  // namespace rollpack
