// Where each array of a micro-batch goes in the one buffer a delivery path
// allocates for it, and the steps every path shares: checking the received
// sizes, pointing the batch's views into the buffer, unpacking the ids.
#ifndef ROLLPACK_CLIENT_TRAINER_BATCH_LAYOUT_H_
#define ROLLPACK_CLIENT_TRAINER_BATCH_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/received_microbatch.h"
#include "client/trainer/array_ref.h"
#include "client/trainer/batch_state.h"
#include "kernels/replay_kernels.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack::trainer_internal {

// Arrays start on 256-byte boundaries: what cudaMalloc guarantees, so every
// view is as aligned as a separate allocation would be.
constexpr int64_t kAlign = 256;
inline int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Slot names of the per-sequence arrays (lifecycle.md section 6):
// "advantages" and "scalar:<name>" for scalars[<name>].
inline constexpr std::string_view kScalarPrefix = "scalar:";

struct Slot {
  // "tokens", ..., "field:<name>", "advantages", "scalar:<name>",
  // "ragged_values:<name>", "ragged_offsets:<name>" (client/cpp/ragged_field.h)
  std::string name;
  ArrayRef ref;      // data = nullptr; shapes and dtype
  int64_t offset = 0;
  int64_t bytes = 0;
  // What the message holds for it: `bytes`, but half as many for uint16
  // ragged values, which are widened to int32 as they are copied (CopySlot).
  int64_t wire_bytes = 0;
  bool widen_uint16 = false;
};

// The order is fixed and computed from shapes alone, so the ranks of a TP
// group agree on it without exchanging it.
struct Layout {
  std::vector<Slot> slots;
  int64_t arrays_bytes = 0;  // copied from the host
  int64_t ids_offset = 0;
  int64_t ids_bytes = 0;
  int64_t total = 0;
  int64_t rows = 0, layers = 0, k = 0;
  // False: the batch carries no replay_ids (an absent array).
  bool unpacked_ids = true;
};

// The ragged token fields' slots come last, values then offsets per field
// in name order; their heads are checked here (ReadRaggedShape) and so are
// their rows against those of tokens and the token fields.
// With `replay_ids` false, no room for unpacked ids (ids_bytes 0, unpacked_ids
// false): the caller writes targets itself (DeviceStreamOptions::replay_ids).
// Per-sequence fields that do not fit the sequences are DATA_LOSS
// (CheckSequenceMetadata, client/cpp/sequence_metadata.h).
absl::StatusOr<Layout> ComputeLayout(const v1::Microbatch& m, bool ids_int32,
                                     bool replay_ids = true);
const Slot* FindSlot(const Layout& l, const std::string& name);
// advantages and scalar:<name>: a few bytes per sequence, parsed with the
// metadata (ReceivedMicrobatch::meta() holds their bytes).
bool IsSequenceSlot(const std::string& name);
// The arrays ClearData leaves in the metadata (cu_seqlens, cu_seqlens_padded
// and the per-sequence arrays): a TP follower copies them from the header.
bool KeptInMeta(const std::string& name);

// A message whose byte fields disagree with their shapes, or whose ragged
// fields' offsets are not from 0, non-decreasing and ending at their
// values' count, is refused (DATA_LOSS) before anything is copied,
// whichever form it arrived in.
absl::Status CheckBytes(const v1::Microbatch& m, const Layout& l);
absl::Status CheckBytes(const ReceivedMicrobatch& m, const Layout& l);
// Tokens, token fields and ragged token fields: the same bytes on every TP
// rank of a (dp, cp, pp) group (TP-leader mode broadcasts them).
bool SameOnEveryTpRank(const std::string& name);
// The same for the slots KeptInMeta alone (a TP header has no other bytes).
absl::Status CheckMetaBytes(const v1::Microbatch& m, const Layout& l);

// Copies the bytes of slot `name` to `out` (ReceivedMicrobatch: straight
// from gRPC's received slices, the one host copy of the payload).
void CopyData(const v1::Microbatch& m, const std::string& name, void* out);
void CopyData(const ReceivedMicrobatch& m, const std::string& name, void* out);
// Copies slot `s` (its `bytes` at `out`), widening uint16 ragged values.
void CopySlot(const v1::Microbatch& m, const Slot& s, void* out);
void CopySlot(const ReceivedMicrobatch& m, const Slot& s, void* out);

// Points the batch's views at `base` + slot offsets (base may be null: the
// host path points them into the message afterwards) and the ids at `ids`.
void AssignViews(const Layout& l, char* base, void* ids, bool ids_int32, BatchState* b);

kernels::UnpackArgs MakeUnpack(const Layout& l, const ArrayRef& experts, const ArrayRef& mask,
                               void* out, bool ids_int32, bool masked_fill_minus_one);

// Drops the big byte fields once they live on the device; cu_seqlens and the
// per-sequence arrays stay (KeptInMeta).
void ClearData(v1::Microbatch* m);

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_BATCH_LAYOUT_H_
