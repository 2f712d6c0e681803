#include "base/keep_freed_memory.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)

int64_t ThreadMinorFaults() {
  rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// A trainer stream's send buffer: allocated, written whole, freed once gRPC
// has sent it; the next micro-batch's comes right after.
void SendBufferCycle(size_t bytes) {
  char* buffer = static_cast<char*>(std::malloc(bytes));
  std::memset(buffer, 0x5a, bytes);
  // Keeps the compiler from dropping the buffer as dead.
  asm volatile("" : : "r"(buffer) : "memory");
  std::free(buffer);
}

// Faults of `cycles` send buffers after a first one, on the calling thread.
int64_t FaultsOfSendBuffers(size_t bytes, int cycles) {
  SendBufferCycle(bytes);
  const int64_t before = ThreadMinorFaults();
  for (int i = 0; i < cycles; ++i) SendBufferCycle(bytes);
  return ThreadMinorFaults() - before;
}

TEST(KeepFreedMemoryTest, AnEmptiedHeapOfAThreadsArenaIsKept) {
  constexpr size_t kSendBuffer = size_t{12} << 20;  // a 65k-token micro-batch's order
  constexpr int kCycles = 8;
  const int64_t pages = kCycles * static_cast<int64_t>(kSendBuffer / sysconf(_SC_PAGESIZE));
  int64_t faults_without_pad = -1, faults_kept = -1;
  bool own_arena = false;
  // rollpackd's settings but the top pad, as before it was set.
  KeepFreedMemory();
  mallopt(M_TOP_PAD, 0);
  std::thread server_thread([&] {
    // Fills the first heap of this thread's arena with samples that stay, so
    // each send buffer takes a heap of its own, as in a server holding a pool.
    std::vector<void*> held;
    for (int i = 0; i < 56; ++i) {
      held.push_back(std::malloc(size_t{1} << 20));
      std::memset(held.back(), 1, size_t{1} << 20);
    }
    own_arena = reinterpret_cast<uintptr_t>(held.front()) > reinterpret_cast<uintptr_t>(sbrk(0));
    faults_without_pad = FaultsOfSendBuffers(kSendBuffer, kCycles);
    KeepFreedMemory();
    faults_kept = FaultsOfSendBuffers(kSendBuffer, kCycles);
    for (void* p : held) std::free(p);
  });
  server_thread.join();
  if (!own_arena) GTEST_SKIP() << "the thread allocates from the main arena (MALLOC_ARENA_MAX=1?)";
  if (faults_without_pad < pages / 2) {
    GTEST_SKIP() << "this glibc keeps an emptied heap by itself: " << faults_without_pad
                 << " faults for " << pages << " pages of send buffers without the pad";
  }
  EXPECT_LT(faults_kept, pages / 20) << "without the pad: " << faults_without_pad;
}

// gRPC's read buffers of one received micro-batch on a receiving thread:
// `count` buffers of `bytes`, written, held until the micro-batch is used,
// then freed. The minor faults of `rounds` such micro-batches after a first.
int64_t FaultsOfReceivedMicrobatches(size_t bytes, int count, int rounds) {
  auto receive = [&] {
    std::vector<char*> buffers;
    for (int i = 0; i < count; ++i) {
      buffers.push_back(static_cast<char*>(std::malloc(bytes)));
      std::memset(buffers.back(), 0x5a, bytes);
    }
    asm volatile("" : : "r"(buffers.data()) : "memory");
    for (char* b : buffers) std::free(b);
  };
  receive();
  const int64_t before = ThreadMinorFaults();
  for (int r = 0; r < rounds; ++r) receive();
  return ThreadMinorFaults() - before;
}

// Each case runs in a process of its own (a death test re-executes the
// binary), since malloc's settings last for the process.
constexpr size_t kReadBuffer = size_t{4} << 20;
constexpr int kBuffersPerMicrobatch = 6;
constexpr int kRounds = 4;

int64_t ReceivedPages() {
  return kRounds * kBuffersPerMicrobatch * static_cast<int64_t>(kReadBuffer / sysconf(_SC_PAGESIZE));
}

// Faults of a receiving thread (its own arena) after `setup` ran on it.
int64_t ReceivingThreadFaults(bool keep) {
  int64_t faults = -1;
  std::thread receiver([&] {
    if (keep) KeepReceivedMemory();
    faults = FaultsOfReceivedMicrobatches(kReadBuffer, kBuffersPerMicrobatch, kRounds);
  });
  receiver.join();
  return faults;
}

class KeepReceivedMemoryTest : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(KeepReceivedMemoryTest, AppliesOncePerProcess) {
  EXPECT_EXIT(
      {
        unsetenv("ROLLPACK_KEEP_FREED_MEMORY");
        const bool first = KeepReceivedMemory();
        const bool second = KeepReceivedMemory();
        std::exit(first && !second ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

TEST_F(KeepReceivedMemoryTest, SwitchedOffLeavesMallocAlone) {
  EXPECT_EXIT(
      {
        setenv("ROLLPACK_KEEP_FREED_MEMORY", "0", 1);
        std::exit(KeepReceivedMemory() ? 1 : 0);
      },
      testing::ExitedWithCode(0), "");
}

// What a receiving thread gains: the read buffers of the second micro-batch
// on reuse the first's memory, where glibc's defaults map and unmap them
// (faulting each page in again) until its dynamic threshold has grown.
TEST_F(KeepReceivedMemoryTest, AReceivingThreadReusesItsReadBuffersFromTheSecondMicrobatch) {
  const int64_t pages = ReceivedPages();
  EXPECT_EXIT(
      {
        const int64_t faults = ReceivingThreadFaults(/*keep=*/true);
        std::fprintf(stderr, "kept: %lld faults for %lld pages\n",
                     static_cast<long long>(faults), static_cast<long long>(pages));
        std::exit(faults < pages / 20 ? 0 : 1);
      },
      testing::ExitedWithCode(0), "kept: ");
}

// The case above measures something: without the setting, the same thread
// faults a large part of the pages again.
TEST_F(KeepReceivedMemoryTest, WithoutItTheReadBuffersAreFaultedInAgain) {
  const int64_t pages = ReceivedPages();
  EXPECT_EXIT(
      {
        const int64_t faults = ReceivingThreadFaults(/*keep=*/false);
        std::fprintf(stderr, "default: %lld faults for %lld pages\n",
                     static_cast<long long>(faults), static_cast<long long>(pages));
        std::exit(faults >= pages / 20 ? 0 : 1);
      },
      testing::ExitedWithCode(0), "default: ");
}

#endif

}  // namespace
}  // namespace rollpack
