// Materialises what one trainer rank receives for one micro-batch, gathering
// straight from the stored samples into the outgoing message's buffers.
#ifndef ROLLPACK_SERVER_MICROBATCH_BUILDER_H_
#define ROLLPACK_SERVER_MICROBATCH_BUILDER_H_

#include "absl/status/status.h"
#include "rollpack/v1/trainer.pb.h"
#include "scheduler/layout.h"
#include "server/step.h"

namespace rollpack {

struct MicrobatchRequest {
  RankCoords rank;
  int index = 0;
  // Tokens and token fields to every pipeline stage.
  bool all_fields = false;
};

// Fills `out` (cleared first). `scratch` is reused between calls of one
// stream to avoid reallocating run vectors. Errors: the layout's
// (INVALID_ARGUMENT for coordinates, OUT_OF_RANGE for the index).
absl::Status BuildMicrobatch(const Step& step, const MicrobatchRequest& request,
                             RankMicrobatchLayout* scratch, v1::Microbatch* out);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_MICROBATCH_BUILDER_H_
