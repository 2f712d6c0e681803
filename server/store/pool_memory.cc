// What holding a sample costs the store in memory, the unit of --max-memory
// and --max-pool-memory (issue 36): every allocation the sample and the
// store's entries for it make, sized as glibc's malloc sizes them.
//
// A fixed 256 bytes of bookkeeping counted a one-token sample as 266-639
// bytes while it held 620-1,275 (server/store/sample_memory_test.cc
// measures it), so a --max-memory full of small samples held twice what it
// said. Most of a small sample's cost is not its arrays: the object itself
// (352 bytes with its shared_ptr block), a map node per token field and
// scalar, the id copied as the key of three indexes, and the indexes'
// entries.
#include <cstdint>

#include "server/store/heap_bytes.h"
#include "server/store/pool.h"

namespace rollpack {
namespace {

// One node of a std::map: its value after a header of three pointers and
// the colour (four words in libstdc++ and libc++).
template <typename Map>
int64_t TreeNodeBytes() {
  return ChunkBytes(static_cast<int64_t>(4 * sizeof(void*) + sizeof(typename Map::value_type)));
}

// One entry of an absl::flat_hash_map: a slot holding the value and a
// control byte, in one array for the table. A table doubles when 7/8 of its
// slots are full, so between 7/16 and 7/8 of them are in use; counting two
// slots per entry (a load of 1/2) keeps the count within 0.875x-1.75x of
// the table's bytes at any size, and a function of the sample alone (the
// same on every run and member, whatever else the table holds).
template <typename Map>
int64_t HashEntryBytes() {
  return 2 * static_cast<int64_t>(sizeof(typename Map::value_type) + 1);
}

// libstdc++'s make_shared puts the object after a block of a vtable
// pointer and two 32-bit counts.
constexpr int64_t kSharedControlBytes = 16;

}  // namespace

int64_t Pool::MemoryBytes(const StoredSample& sample) {
  // The object, made by make_shared (an open sample is held in the open
  // map instead: counted as sealed, within ~15% of its entry there, and its
  // count does not change when it is sealed).
  int64_t bytes = ChunkBytes(kSharedControlBytes + static_cast<int64_t>(sizeof(StoredSample)));
  bytes += StringHeapBytes(sample.sample_id) + StringHeapBytes(sample.group_id) +
           VectorHeapBytes(sample.tokens) + StringHeapBytes(sample.experts) +
           VectorHeapBytes(sample.row_valid) + VectorHeapBytes(sample.pieces);
  for (const auto& [name, field] : sample.token_fields) {
    bytes += TreeNodeBytes<decltype(sample.token_fields)>() + StringHeapBytes(name) +
             VectorHeapBytes(field.trailing_shape) + StringHeapBytes(field.data);
  }
  // Ragged fields (layout.md section 13): their ids and 8 bytes per offset.
  for (const auto& [name, field] : sample.ragged_fields) {
    bytes += TreeNodeBytes<decltype(sample.ragged_fields)>() + StringHeapBytes(name) +
             VectorHeapBytes(field.offsets) + StringHeapBytes(field.values);
  }
  for (const auto& [name, value] : sample.scalars) {
    bytes += TreeNodeBytes<decltype(sample.scalars)>() + StringHeapBytes(name);
  }
  // Names of scalars added after it was put (annotations), kept apart.
  bytes += VectorHeapBytes(sample.later_scalars);
  for (const std::string& name : sample.later_scalars) bytes += StringHeapBytes(name);
  // Its entries in the pool's indexes of sealed samples, three keyed by a
  // copy of its id.
  const int64_t key = StringCopyHeapBytes(sample.sample_id);
  bytes += HashEntryBytes<decltype(Pool::samples)>() + key;
  bytes += HashEntryBytes<decltype(Pool::arrival_of)>() + key;
  bytes += HashEntryBytes<decltype(Pool::arrival_unix_nanos)>() + key;
  bytes += TreeNodeBytes<Pool::FreeSamples>();
  // Its share of its group's entry (the group's size is fixed, so the
  // shares of a whole group add up to the entry).
  if (sample.grouped()) {
    const int64_t group = HashEntryBytes<decltype(Pool::groups)>() +
                          StringCopyHeapBytes(sample.group_id);
    bytes += (group + sample.group_size - 1) / sample.group_size;
  }
  return bytes;
}

}  // namespace rollpack
