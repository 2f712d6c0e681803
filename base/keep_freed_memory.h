// Process-wide malloc settings for a process that moves gigabytes of payload:
// rollpackd, and a trainer process receiving its micro-batches.
#ifndef ROLLPACK_BASE_KEEP_FREED_MEMORY_H_
#define ROLLPACK_BASE_KEEP_FREED_MEMORY_H_

namespace rollpack {

// Keeps freed memory for the next samples instead of handing it back to the
// kernel: every page handed back costs a page fault and zeroing when the next
// ingest touches it, a third of ingest's server CPU (docs/performance.md).
// RSS then stays near its peak, which --max-memory bounds anyway.
//
// Kept memory is reused only by threads allocating from the same malloc arena,
// and glibc gives up to 8 arenas per core: on a 16-core host the samples of
// one step were parsed on threads whose arenas did not hold the freed memory
// of the last, and peak RSS reached 1.5-1.65x the payload held. Two arenas
// bring it to 1.09-1.14x with no loss of throughput (docs/performance.md). An
// operator's MALLOC_ARENA_MAX or glibc.malloc.arena_max tunable wins.
// An emptied heap of a thread's arena is kept too (the top pad,
// kKeptTopPadBytes): trimming alone does not keep it. An operator's
// MALLOC_TOP_PAD_ or glibc.malloc.top_pad tunable wins.
// Call first in main, before any thread starts (rollpackd, and the gRPC sink
// of `rollpack bench transport`, so both pay the same for memory).
void KeepFreedMemory();

// The part of it a trainer process needs, applied once per process by the
// client library when it opens its first trainer stream (TrainerStream):
// gRPC receives a micro-batch into read buffers of up to megabytes, which
// glibc first maps one by one and unmaps when freed, and a thread arena's
// heap grows and shrinks by a few pages at a time. Each of those takes the
// process's memory-map lock, which every other thread's page fault waits on:
// the first step of a run, whose buffers are all fresh, was received at 0.43
// of the rate of the fourth (docs/performance.md, "The first round"). Large
// buffers from the heap and a heap that grows and is kept in steps of a
// heap's size (the top pad) bring it to 0.9. No arena limit and no trim
// threshold: the trainer's own allocations keep glibc's defaults for those.
// An operator's MALLOC_MMAP_THRESHOLD_ / MALLOC_TOP_PAD_ (or the matching
// glibc.malloc tunables) wins for each; ROLLPACK_KEEP_FREED_MEMORY=0 leaves
// malloc alone. Costs at most a heap's size (64 MiB) of freed memory kept
// per malloc arena. Returns whether it changed anything (false after the
// first call, or when switched off).
bool KeepReceivedMemory();

// glibc's largest heap of a non-main arena on 64-bit (HEAP_MAX_SIZE): a top
// pad this large means such a heap is never unmapped when it empties.
inline constexpr int kKeptTopPadBytes = 64 << 20;

// Buffers at least this large are mapped on their own (glibc's largest
// dynamic threshold; anything a micro-batch holds is below it).
inline constexpr int kKeptMmapThresholdBytes = 32 << 20;

}  // namespace rollpack

#endif  // ROLLPACK_BASE_KEEP_FREED_MEMORY_H_
