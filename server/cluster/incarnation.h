// A member's incarnation (docs/cluster.md, "Data loss"): an id that stays the
// same while the member keeps its data and changes whenever it starts
// without it. A step records the incarnation of each member that holds its
// samples; a member answering with another one was restarted empty, so the
// step's samples there are lost, not merely away.
#ifndef ROLLPACK_SERVER_CLUSTER_INCARNATION_H_
#define ROLLPACK_SERVER_CLUSTER_INCARNATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rollpack {

// 32 lowercase hex digits: what a member writes, and all a reader accepts
// (from etcd or a peer).
bool IsIncarnation(absl::string_view text);

// A fresh random incarnation.
std::string NewIncarnation();

// The incarnation of a member whose durable log is in `data_dir`: the one
// in DATA_DIR/incarnation when the log held records at start
// (`log_had_records`) and the file holds a valid one; otherwise a fresh one,
// written there (write, fsync, rename) before the member serves. A member
// without --data-dir takes NewIncarnation() at every start.
absl::StatusOr<std::string> DataDirIncarnation(const std::string& data_dir, bool log_had_records);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_INCARNATION_H_
