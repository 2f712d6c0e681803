// How a trainer rank's micro-batches travel (docs/trainer.md, "Direct
// pulls"): its own header so the options of every layer that passes it on
// (TrainerStreamOptions, DeviceStreamOptions) name it without pulling in a
// stream.
#ifndef ROLLPACK_CLIENT_CPP_DELIVERY_MODE_H_
#define ROLLPACK_CLIENT_CPP_DELIVERY_MODE_H_

namespace rollpack {

enum class Delivery {
  // Direct pulls when the servers serve them (Trainer.FetchPieces), else
  // (an older rollpackd answers UNIMPLEMENTED) the proxied stream.
  kAuto,
  // Trainer.FetchPieces only: the member dialled sends each micro-batch's
  // header piece and its own rows, the other members holding samples of it
  // their rows, each on a stream of its own; the rank assembles them.
  kDirect,
  // Trainer.FetchMicrobatches: the member dialled gathers every row (in a
  // cluster, pulling the other members' samples itself) and sends whole
  // micro-batches.
  kProxy,
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_DELIVERY_MODE_H_
