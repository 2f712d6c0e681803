// A validated sample as the store keeps it: routed experts normalised to the
// compact layout [n, |M|, K] at the narrowest width that holds E, whatever
// layout, dtype, row offset and row count the producer sent.
#ifndef ROLLPACK_SERVER_STORE_STORED_SAMPLE_H_
#define ROLLPACK_SERVER_STORE_STORED_SAMPLE_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

struct StoredField {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  // Dimensions after the first (token) one.
  std::vector<int64_t> trailing_shape;
  // C-order bytes, n * product(trailing_shape) * itemsize.
  std::string data;

  int64_t row_bytes() const;
  friend bool operator==(const StoredField& a, const StoredField& b) {
    return a.dtype == b.dtype && a.trailing_shape == b.trailing_shape && a.data == b.data;
  }
};

// A ragged per-token field (layout.md section 13): token t's list is
// ids [offsets[t], offsets[t + 1]) of `values`.
struct StoredRagged {
  // UINT16 when the model's 0 < vocab_size <= 65536, else INT32
  // (ModelSpec::ragged_id_bytes), whatever dtype came in.
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  // [n + 1], offsets[0] = 0, non-decreasing, offsets[n] = ids held.
  std::vector<int64_t> offsets;
  // The ids, little endian, offsets[n] * itemsize bytes.
  std::string values;

  int64_t num_tokens() const { return offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1; }
  friend bool operator==(const StoredRagged& a, const StoredRagged& b) {
    return a.dtype == b.dtype && a.offsets == b.offsets && a.values == b.values;
  }
};

// Bit-for-bit, so an identical re-send with a NaN scalar is a duplicate
// (NaN != NaN); found by fuzz/sample_validation_fuzzer.
inline bool SameScalars(const std::map<std::string, double>& a,
                        const std::map<std::string, double>& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
    if (i->first != j->first || std::memcmp(&i->second, &j->second, sizeof(double)) != 0) {
      return false;
    }
  }
  return true;
}

// One message of a sample sent in pieces (lifecycle.md section 5), in
// whole-sample positions: its tokens end at `token_end` (they start where
// the previous piece's end), and it carried routed-expert rows
// [rows_begin, rows_end) (equal when it carried none).
struct PieceBounds {
  int64_t token_end = 0;
  int64_t rows_begin = 0;
  int64_t rows_end = 0;
  int64_t policy_version = 0;
  bool partial = false;
  // It sent a routed_experts payload (of rows_end - rows_begin rows, maybe 0).
  bool rows_sent = false;
  friend bool operator==(const PieceBounds& a, const PieceBounds& b) {
    return a.token_end == b.token_end && a.rows_begin == b.rows_begin &&
           a.rows_end == b.rows_end && a.policy_version == b.policy_version &&
           a.partial == b.partial && a.rows_sent == b.rows_sent;
  }
};

// What a validated piece message adds to its sample. Its StoredSample holds
// the piece alone: its new tokens and token-field rows, and routed-expert
// rows [rows_begin, rows_begin + row_valid.size()) only.
struct PieceMessage {
  int32_t index = 0;
  bool partial = false;
  int64_t rows_begin = 0;
  // A routed_experts payload was sent (possibly of zero rows, which still
  // says where the rows end).
  bool rows_sent = false;
};

// What holding one costs in memory, the unit of the store's limits, is
// SampleStore::MemoryBytes.
struct StoredSample {
  std::string sample_id;
  std::string group_id;
  int64_t policy_version = 0;
  // Samples in the group (lifecycle.md); 0 = ungrouped. The pool's
  // default_group_size is applied when the store takes the sample.
  int32_t group_size = 0;
  std::vector<int32_t> tokens;
  // [n, |M| + D, K] expert ids (D: MTP layers with mtp_routing, layout.md
  // section 10), 1 byte each when E <= 256, else 2 (little endian); empty
  // for dense models. Rows with row_valid 0 hold zeros.
  std::string experts;
  // [n]: 1 where the producer sent a replayable row; 0 where the row was
  // outside the payload or all -1 (missing).
  std::vector<uint8_t> row_valid;
  // Sorted by name, so iteration order is deterministic.
  std::map<std::string, StoredField> token_fields;
  // Ragged per-token fields by name (sorted: deterministic), each with one
  // list per token.
  std::map<std::string, StoredRagged> ragged_fields;
  // Every scalar it has now: those put with it and those added later.
  std::map<std::string, double> scalars;
  // The names in `scalars` that were not put with piece 0 (or the whole
  // sample): added by the piece that sealed it or by AnnotateSamples
  // (lifecycle.md section 6). Sorted. An identical re-send is compared with
  // the sample as put, without them (SameAsPut).
  std::vector<std::string> later_scalars;
  // A sample sent in pieces: each piece's bounds, in order (empty: sent
  // whole). The last is partial while the sample is open.
  std::vector<PieceBounds> pieces;
  // Set on a piece message as validated (never on a stored sample): this
  // object is then the piece alone (see PieceMessage).
  std::optional<PieceMessage> piece_message;
  // Bytes of the log records that hold a sample sent in pieces (one per
  // piece): what its release makes dead. 0 otherwise. Not part of its
  // content (not encoded, not compared).
  int64_t logged_bytes = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  bool grouped() const { return group_size > 0 && !group_id.empty(); }

  friend bool operator==(const StoredSample& a, const StoredSample& b) {
    return a.sample_id == b.sample_id && a.group_id == b.group_id &&
           a.policy_version == b.policy_version && a.group_size == b.group_size &&
           a.tokens == b.tokens &&
           a.experts == b.experts && a.row_valid == b.row_valid &&
           a.token_fields == b.token_fields && a.ragged_fields == b.ragged_fields &&
           SameScalars(a.scalars, b.scalars) &&
           a.later_scalars == b.later_scalars && a.pieces == b.pieces && a.piece_message.has_value() == b.piece_message.has_value() &&
           (!a.piece_message.has_value() ||
            (a.piece_message->index == b.piece_message->index &&
             a.piece_message->partial == b.piece_message->partial &&
             a.piece_message->rows_begin == b.piece_message->rows_begin &&
             a.piece_message->rows_sent == b.piece_message->rows_sent));
  }
};

// `sample.scalars` without its later_scalars: the scalars it was put with.
std::map<std::string, double> PutScalars(const StoredSample& sample);

// Whether `sent` (a sample as validated, never stored) is `stored` as it was
// put: scalars added to `stored` since do not make an identical re-send differ.
bool SameAsPut(const StoredSample& stored, const StoredSample& sent);

// Adds `scalars` the sample lacks to it as later scalars; the names it has
// keep their values. Returns how many it added.
int AddLaterScalars(const std::map<std::string, double>& scalars, StoredSample* sample);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STORED_SAMPLE_H_
