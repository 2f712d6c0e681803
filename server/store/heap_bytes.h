// Bytes a buffer takes from glibc's malloc, for counting what the store
// holds (pool_memory.cc) and what storing a piece will add
// (open_samples.cc). Internal to server/store.
#ifndef ROLLPACK_SERVER_STORE_HEAP_BYTES_H_
#define ROLLPACK_SERVER_STORE_HEAP_BYTES_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace rollpack {

// A glibc malloc chunk (64-bit): the request plus its 8-byte size header,
// rounded up to 16, at least 32. A chunk past the mmap threshold is rounded
// to a page instead: under 1% of such a payload, not counted.
inline int64_t ChunkBytes(int64_t request) {
  return std::max<int64_t>(32, (request + 8 + 15) & ~int64_t{15});
}

// Strings up to this many characters are held inside the object (15 in
// libstdc++) and allocate nothing.
inline int64_t InlineStringCapacity() {
  static const int64_t capacity = static_cast<int64_t>(std::string().capacity());
  return capacity;
}

// The buffer of a string of `capacity` characters (and its terminator).
inline int64_t StringBufferBytes(int64_t capacity) {
  return capacity > InlineStringCapacity() ? ChunkBytes(capacity + 1) : 0;
}

// The buffer a string holds: by capacity, not size (a string grown by
// appends, or assigned to an empty one, may have room to spare).
inline int64_t StringHeapBytes(const std::string& s) {
  return StringBufferBytes(static_cast<int64_t>(s.capacity()));
}

// The buffer of a copy of `s` (an index's key): a copy is sized exactly.
inline int64_t StringCopyHeapBytes(const std::string& s) {
  return StringBufferBytes(static_cast<int64_t>(s.size()));
}

// The buffer of a vector of `capacity` elements of `T`.
template <typename T>
int64_t VectorBufferBytes(int64_t capacity) {
  return capacity == 0 ? 0 : ChunkBytes(capacity * static_cast<int64_t>(sizeof(T)));
}

template <typename T>
int64_t VectorHeapBytes(const std::vector<T>& v) {
  return VectorBufferBytes<T>(static_cast<int64_t>(v.capacity()));
}

// The capacity a buffer of `capacity` takes to hold `needed`: unchanged
// when it has room; else, while more may be appended, at least doubled (so
// that appending piece after piece stays linear: what libstdc++ gives a
// string assigned, resized or appended to), and for the `last` append
// `needed` exactly. The store grows an open sample's buffers so
// (open_samples.cc), so that what a piece will add is known before it
// is stored.
inline int64_t GrownCapacity(int64_t capacity, int64_t needed, bool last) {
  if (needed <= capacity) return capacity;
  return last ? needed : std::max(needed, 2 * capacity);
}

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_HEAP_BYTES_H_
