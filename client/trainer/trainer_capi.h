/* C ABI of the trainer client (librollpack_trainer.so), docs/trainer.md.
 *
 * One shared library holds the gRPC client, the device stream (pinned
 * staging, async copies, the unpack kernel, TP-leader mode over NCCL) and the
 * replay kernels (CPU references and, when built with CUDA, the CUDA
 * versions). A C ABI so that it can be built on one machine and loaded from
 * any Python through ctypes (rollpack/_capi.py), with nothing compiled
 * against a Python or libtorch version: arrays leave as DLPack
 * DLManagedTensor pointers.
 *
 * Every int-returning function returns 0 on success, else an absl/gRPC status
 * code, with the message in rpt_last_error() (per thread) and, for a stream,
 * the micro-batch to resume from in rpt_last_resume_from().
 */
#ifndef ROLLPACK_CLIENT_TRAINER_TRAINER_CAPI_H_
#define ROLLPACK_CLIENT_TRAINER_TRAINER_CAPI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: rpt_connect_options, rpt_open2, rpt_client_*, rpt_report_routing_agreement.
 * 3: rpt_stream_open with rpt_stream_options replaces rpt_open (ABI 1) and
 *    rpt_open2 (ABI 2), which are gone: a caller built for an older ABI fails
 *    to find its entry point instead of passing arguments in the wrong places.
 *    Since grown, without a new version (nothing changed, only added):
 *    rpt_stream_options.resume_timeout_ms and .max_resumes,
 *    rpt_last_resume_from, rpt_stream_options.delivery, rpt_unpack_static,
 *    rpt_store_rows and rpt_stage_static; the per-sequence metadata
 *    (lifecycle.md section 6): rpt_batch_num_group_ids, rpt_batch_group_id,
 *    rpt_batch_policy_versions, rpt_batch_num_scalars, rpt_batch_scalar_name,
 *    rpt_batch_has_array and rpt_batch_dlpack's "advantages" and
 *    "scalar:<name>"; the ragged token fields (layout.md section 13):
 *    rpt_batch_num_ragged_fields, rpt_batch_ragged_field_name and
 *    rpt_batch_dlpack's "ragged_values:<name>" and "ragged_offsets:<name>". */
#define RPT_ABI_VERSION 3

int rpt_abi_version(void);
const char* rpt_last_error(void);
/* The micro-batch index to resume from that the error of the last failed
 * call on this thread carries (rpt_next, rpt_stream_open): pass it as
 * start_index to a new stream of the same rank. -1 when that error carries
 * none (not a stream's) or no call failed yet. */
int64_t rpt_last_resume_from(void);
/* 1 when built with CUDA (device >= 0 and TP-leader mode available). */
int rpt_has_cuda(void);
/* Aborts the NCCL communicators TP-leader mode keeps between steps of the
 * same group (idle ones only); later steps create new ones. No-op without
 * CUDA or when none are kept. */
void rpt_close_tp_communicators(void);

/* How to reach rollpackd: token auth and TLS (docs/operations.md). Set
 * struct_size = sizeof(rpt_connect_options) and zero what is unused. Fields
 * are only ever added at the end, and the library reads only the first
 * struct_size bytes (the rest counts as zero, which always means "off"), so
 * callers built against an older header keep working. Strings are
 * NUL-terminated; NULL = empty. */
typedef struct rpt_connect_options {
  uint32_t struct_size;
  /* Sent as `authorization: Bearer <auth_token>` on every call. */
  const char* auth_token;
  /* TLS: when tls != 0, or any PEM below is set. No root certificates =
   * gRPC's default roots. Client certificate + key = mutual TLS. */
  int tls;
  const char* tls_root_certs_pem;
  const char* tls_client_cert_pem;
  const char* tls_client_key_pem;
  /* Name checked against the server certificate instead of the address's. */
  const char* tls_server_name;
} rpt_connect_options;

/* One rank's stream: its coordinates and how its micro-batches are
 * delivered (DeviceStreamOptions in client/trainer/device_stream_options.h).
 * Set struct_size = sizeof(rpt_stream_options). As for rpt_connect_options,
 * fields are only ever added at the end, the library reads only the first
 * struct_size bytes and counts the rest as zero, and a later field's zero
 * keeps the behaviour of the ABI before it, with one deliberate exception:
 * resume_timeout_ms (the old behaviour, 5 immediate retries, could not ride
 * out a restart; docs/trainer.md); struct_size must cover at least the
 * fields below (ABI 3). */
typedef struct rpt_stream_options {
  uint32_t struct_size;
  /* This process's rank in the step's topology. */
  int32_t dp;
  int32_t cp;
  int32_t tp;
  int32_t pp;
  /* CUDA device ordinal; -1 = host arrays (CPU reference unpack). */
  int32_t device;
  /* Micro-batches read ahead (and staged on the device); < 1 counts as 1. */
  int32_t prefetch;
  /* Non-zero: tokens and token fields on every pipeline stage, not only on
   * the first (tokens) and the last (token fields). */
  int32_t all_fields;
  /* Resume at this micro-batch. */
  int32_t start_index;
  /* Non-zero: replay ids unpacked as int32 instead of int64. */
  int32_t ids_int32;
  /* Non-zero: ids of rows with mask 0 are -1 instead of the filler ids. */
  int32_t masked_fill_minus_one;
  /* > 1: TP-leader mode for a TP group of this size (CUDA + NCCL). */
  int32_t tp_leader_size;
  /* Seconds TP ranks wait at the rendezvous; <= 0 = 300. */
  int32_t rendezvous_timeout_s;
  /* Part of the rendezvous key: a fresh one when a group opens the same
   * step again. NUL-terminated; NULL = empty. */
  const char* rendezvous_tag;
  /* Appended after ABI 3's first release. How long a broken stream keeps
   * resuming (exponential backoff) from its first failure with no
   * micro-batch received since, in milliseconds: 0 = the library's default
   * (60000: a caller built against the older header gets it too, where it
   * had 5 immediate retries), < 0 = no limit. */
  int32_t resume_timeout_ms;
  /* An additional cap on failed resume attempts in a row: 0 = none (only
   * resume_timeout_ms counts), > 0 = at most this many, < 0 = never resume. */
  int32_t max_resumes;
  /* Appended later: how micro-batches travel (docs/trainer.md, "Direct
   * pulls"). RPT_DELIVERY_AUTO (0, also what an older caller's shorter
   * struct reads as) = direct pulls when the server serves them, else
   * proxied; RPT_DELIVERY_DIRECT (1) = direct pulls only; RPT_DELIVERY_PROXY
   * (2) = the member dialled sends whole micro-batches. */
  int32_t delivery;
  /* Appended later: non-zero = no replay_ids per batch (an absent array; no
   * device memory or unpack kernel spent on it), for callers that write
   * targets into a static buffer (rpt_stage_static). 0, also what an older
   * caller's shorter struct reads as, unpacks them as before. */
  int32_t skip_replay_ids;
  /* Appended later: how long a stream that never reached its address keeps
   * trying one that does not resolve or refuses connections, in
   * milliseconds (docs/trainer.md, "Riding out restarts"): 0, also what an
   * older caller's shorter struct reads as, = 10000; < 0 = the whole
   * resume_timeout_ms, as before. A failed TLS handshake or refused
   * credentials end the stream at once either way. */
  int32_t connect_grace_ms;
} rpt_stream_options;

#define RPT_DELIVERY_AUTO 0
#define RPT_DELIVERY_DIRECT 1
#define RPT_DELIVERY_PROXY 2

/* Opens one rank's stream of `step_id`. connect may be NULL (plaintext, no
 * token); options may not. */
int rpt_stream_open(const char* address, const rpt_connect_options* connect,
                    const char* step_id, const rpt_stream_options* options, void** out_stream);
/* *out_batch = NULL after the last micro-batch. consumer_stream: a
 * cudaStream_t (NULL = legacy default stream) made to wait for the batch. */
int rpt_next(void* stream, void* consumer_stream, void** out_batch);
void rpt_close(void* stream);

/* A connection for unary calls (one channel, reused across calls). */
int rpt_client_open(const char* address, const rpt_connect_options* connect, void** out_client);
void rpt_client_close(void* client);
/* Reports one rank's routing agreement (Telemetry.ReportRoutingAgreement):
 * for each i < num_layers, global MoE layer layers[i] with stats[3 * i ..]
 * = (rows_compared, rows_disagreeing, overlapping_experts), the layout the
 * rpt_agreement_* functions write (host memory). out_totals (NULL = not
 * wanted): int64[4] = the step's rows_compared, rows_disagreeing,
 * overlapping_experts and reports so far, over all ranks. Not retried: a
 * re-sent report counts twice. */
int rpt_report_routing_agreement(void* client, const char* step_id, int dp, int cp, int tp,
                                 int pp, int topk, int num_layers, const int32_t* layers,
                                 const int64_t* stats, int64_t* out_totals);

void rpt_batch_free(void* batch);
/* name: index, num_microbatches, local_cp_size, local_cp_rank, max_seqlen,
 * device. -1 for an unknown name. */
int64_t rpt_batch_int(void* batch, const char* name);
double rpt_batch_workload(void* batch);
const char* rpt_batch_step_id(void* batch);
int rpt_batch_num_samples(void* batch);
const char* rpt_batch_sample_id(void* batch, int i);
int rpt_batch_num_layers(void* batch);
int rpt_batch_layer(void* batch, int i);
int rpt_batch_num_fields(void* batch);
const char* rpt_batch_field_name(void* batch, int i);
/* A new DLManagedTensor* (keeps the batch's memory alive until its deleter
 * runs) for: tokens, cu_seqlens, cu_seqlens_padded, replay_experts,
 * replay_mask, replay_ids, field:<name>, advantages (float32 [S]),
 * scalar:<name> (float64 [S]), ragged_values:<name> and
 * ragged_offsets:<name> (below), on the batch's device. NULL for an unknown
 * name. uint16 replay ids are exported as int16 (ids < 1024, same bits). An
 * absent array (replay_ids skipped, advantages of a step without an
 * estimator) comes as uint8 [0]: ask rpt_batch_has_array first. */
void* rpt_batch_dlpack(void* batch, const char* name);
/* 1 when the batch has the array `name` (a rpt_batch_dlpack name) and it is
 * present, else 0 (unknown, or absent as above). */
int rpt_batch_has_array(void* batch, const char* name);

/* Per sequence, in the order of the sample ids (lifecycle.md section 6),
 * checked against their number when the batch was made. Group ids and
 * policy versions are host data: rpt_batch_num_group_ids is the number of
 * sample ids, or 0 when a rollpackd older than these fields sent the
 * micro-batch; rpt_batch_group_id(i) is "" for an ungrouped sample (NULL
 * for i out of range); rpt_batch_policy_versions points at that many
 * int64 (valid while the batch lives; NULL when there are none). Scalars
 * (every sample of the step has each) and advantages are arrays:
 * rpt_batch_dlpack "scalar:<name>" and "advantages". */
int rpt_batch_num_group_ids(void* batch);
const char* rpt_batch_group_id(void* batch, int i);
const int64_t* rpt_batch_policy_versions(void* batch);
int rpt_batch_num_scalars(void* batch);
const char* rpt_batch_scalar_name(void* batch, int i);
/* Ragged token fields (layout.md section 13; docs/trainer.md), delivered
 * with the token fields, in name order: rpt_batch_ragged_field_name(i) is
 * NULL for i out of range. Each is two arrays on the batch's device:
 * rpt_batch_dlpack "ragged_values:<name>" (int32 [num_values]: uint16 ids
 * are widened to int32 when staged) and "ragged_offsets:<name>" (int64
 * [rows + 1] over the rows of tokens, from 0; row r's list is
 * values[offsets[r] : offsets[r + 1]], empty on padding rows). Both were
 * checked when the batch was made. */
int rpt_batch_num_ragged_fields(void* batch);
const char* rpt_batch_ragged_field_name(void* batch, int i);
/* Frees a DLManagedTensor nobody consumed. */
void rpt_dlpack_free(void* managed);

/* Kernels (semantics in kernels/replay_kernels.h). device < 0: CPU
 * reference on host pointers; else the CUDA version on device pointers,
 * asynchronous on `stream`. Type codes: index 0=u8 1=u16 2=i32 3=i64;
 * float 0=f32 1=bf16; score 0=softmax 1=sigmoid. stats: int64[layers * 3]
 * (rows_counted, rows_differ, overlap_sum), host or device memory. */
int rpt_unpack(int device, const void* experts, int in_type, const uint8_t* mask, int64_t rows,
               int64_t layers, int k, void* out, int out_type, int masked_fill_minus_one,
               void* stream);
int rpt_apply_forward(int device, const void* logits, int logits_type, const void* ids,
                      int ids_type, int64_t ids_row_stride, int64_t rows, int e, int k, int score,
                      int renormalize, float scale, float* probs, uint8_t* routing_map,
                      float* probs_dense, void* stream);
int rpt_apply_backward(int device, const void* logits, int logits_type, const void* ids,
                       int ids_type, int64_t ids_row_stride, int64_t rows, int e, int k,
                       int score, int renormalize, float scale, const float* grad_probs,
                       void* grad_logits, void* stream);
int rpt_agreement_logits(int device, const void* logits, int logits_type,
                         int64_t logits_layer_stride, const void* replay, int replay_type,
                         int64_t replay_row_stride, int64_t replay_layer_stride,
                         const uint8_t* mask, int64_t rows, int64_t layers, int e, int k,
                         int64_t* stats, void* stream);
int rpt_agreement_ids(int device, const void* live, int live_type, int64_t live_row_stride,
                      int64_t live_layer_stride, const void* replay, int replay_type,
                      int64_t replay_row_stride, int64_t replay_layer_stride, const uint8_t* mask,
                      int64_t rows, int64_t layers, int k, int64_t* stats, void* stream);

/* Static replay buffers (docs/trainer.md, "Static replay buffers";
 * semantics in kernels/unpack_static.h): the targets of a micro-batch of
 * `rows` router rows written into a caller's buffer of max_rows rows, target
 * (r, l, j) at out + r * out_row_stride + l * out_layer_stride + j elements
 * (-1, -1 = the contiguous [max_rows, layers, K] buffer), rows past `rows`
 * filled with the ids (r * K + j) mod num_experts. rows_ptr: NULL = `rows`;
 * else the row count is read from *rows_ptr (device memory for device >= 0)
 * when the kernel runs, and experts / mask hold max_rows rows: what a
 * captured CUDA graph replays. INVALID_ARGUMENT (nothing launched) when rows
 * > max_rows, naming both. device >= 0: only a kernel launch on `stream` (no
 * allocation, copy or synchronisation), so it may be called while `stream`
 * is captured. */
int rpt_unpack_static(int device, const void* experts, int in_type, const uint8_t* mask,
                      int64_t rows, const int64_t* rows_ptr, int64_t layers, int k,
                      int num_experts, void* out, int out_type, int64_t max_rows,
                      int64_t out_row_stride, int64_t out_layer_stride,
                      int masked_fill_minus_one, void* stream);
/* *rows_ptr = rows, ordered on `stream` (device >= 0: a one-thread kernel,
 * no host-to-device copy; device < 0: a host store). */
int rpt_store_rows(int device, int64_t* rows_ptr, int64_t rows, void* stream);
/* Stages a micro-batch for a captured rpt_unpack_static (rows_ptr): copies
 * its received ids [rows, layers, K] (in_type 0 = uint8, 1 = uint16) and mask
 * (NULL = all ones) into the staging buffers [max_rows, layers, K] (same
 * dtype) and [max_rows], and stores rows in *staging_rows, all ordered on
 * `stream` (device to device copies and a one-thread kernel; host memory for
 * device < 0). Not capturable (the sources are the micro-batch's own
 * memory). INVALID_ARGUMENT naming both numbers when rows > max_rows or the
 * dtypes differ; `index` (the micro-batch's, -1 = unknown) is named in
 * messages. */
int rpt_stage_static(int device, const void* experts, int in_type, const uint8_t* mask,
                     int64_t rows, int64_t layers, int k, int index, void* staging_experts,
                     int staging_type, uint8_t* staging_mask, int64_t* staging_rows,
                     int64_t max_rows, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* ROLLPACK_CLIENT_TRAINER_TRAINER_CAPI_H_ */
