// Direct pulls (trainer.proto, PieceRows; docs/delivery.md): one micro-batch
// assembled from its pieces, each received from the member that holds some
// of its samples. Nothing is copied here: the result keeps every piece's
// gRPC slices and notes where each piece's rows go, so the consumer's one
// copy (ReceivedMicrobatch::CopyData) scatters them to their place, as it
// copies a message FetchMicrobatches sent. ToMessage() of the result is
// byte-identical (deterministic serialization) to what FetchMicrobatches
// sends for the same rank and index.
#ifndef ROLLPACK_CLIENT_CPP_MICROBATCH_ASSEMBLY_H_
#define ROLLPACK_CLIENT_CPP_MICROBATCH_ASSEMBLY_H_

#include <vector>

#include "absl/status/statusor.h"
#include "client/cpp/received_microbatch.h"

namespace rollpack {

// `header`: the header piece (piece.header set) of the micro-batch, from the
// member the rank dials. `pieces`: one piece from each member the header
// lists in piece.members, in that order (piece.header not set).
//
// The result: the header's fields without `piece`; tokens, token fields,
// replay_experts and replay_mask with the dtype and shape every piece that
// has them agrees on, and their rows from the pieces that list them
// (token_rows, router_rows); cu_seqlens and cu_seqlens_padded from the
// header; each ragged token field (layout.md section 13) with its rows'
// lists from the pieces that list those rows, in row order, and its
// offsets rebased from 0 over all rows (its values stay in the pieces'
// slices; the offsets are rewritten). DATA_LOSS, naming the member, the
// micro-batch, the array and the rows, for anything else: a ragged field
// whose offsets do not start at 0, decrease, end elsewhere than at its
// values' count or cover other rows than its piece's token_rows, values of
// another dtype than the other pieces' or of a size their count does not
// give; a piece of another step or index, a header
// where none belongs or none where one does, spans that are malformed, out
// of the array's rows, overlapping or leaving rows uncovered, data whose
// size is not the rows' bytes, pieces disagreeing on an array's dtype or
// shape.
absl::StatusOr<ReceivedMicrobatch> AssembleMicrobatch(ReceivedMicrobatch header,
                                                      std::vector<ReceivedMicrobatch> pieces);

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_MICROBATCH_ASSEMBLY_H_
