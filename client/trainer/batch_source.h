// The interface DeviceStream hands its calls to: one implementation per
// delivery path (host, one rank's CUDA staging, TP leader), so that
// device_stream.cc only chooses one and the paths never see each other.
#ifndef ROLLPACK_CLIENT_TRAINER_BATCH_SOURCE_H_
#define ROLLPACK_CLIENT_TRAINER_BATCH_SOURCE_H_

#include <algorithm>
#include <memory>

#include "absl/status/statusor.h"
#include "client/cpp/trainer_stream.h"
#include "client/trainer/device_batch.h"
#include "client/trainer/device_stream_options.h"

namespace rollpack::trainer_internal {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // See DeviceStream::Next.
  virtual absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void* consumer_stream) = 0;
};

// What every path asks of the network side, whatever it does with it.
inline TrainerStreamOptions NetworkOptions(const DeviceStreamOptions& o) {
  TrainerStreamOptions t;
  t.prefetch = std::max(1, o.prefetch);
  t.all_fields = o.all_fields;
  t.start_index = o.start_index;
  t.resume_timeout = o.resume_timeout;
  t.max_resumes = o.max_resumes;
  t.connect_grace = o.connect_grace;
  t.target = o.target;
  t.tls = o.tls;
  t.auth_token = o.auth_token;
  t.delivery = o.delivery;
  return t;
}

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_BATCH_SOURCE_H_
