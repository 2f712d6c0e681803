// Process-wide malloc settings for a server that holds gigabytes of payload.
#ifndef ROLLPACK_SERVER_OPS_KEEP_FREED_MEMORY_H_
#define ROLLPACK_SERVER_OPS_KEEP_FREED_MEMORY_H_

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

// glibc's largest heap of a non-main arena on 64-bit (HEAP_MAX_SIZE): a top
// pad this large means such a heap is never unmapped when it empties.
inline constexpr int kKeptTopPadBytes = 64 << 20;

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_KEEP_FREED_MEMORY_H_
