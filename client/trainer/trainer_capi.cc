#include "client/trainer/trainer_capi.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/ragged_field.h"
#include "client/cpp/stream_resume.h"
#include "client/trainer/device_stream.h"
#include "client/trainer/static_targets.h"
#include "kernels/replay_kernels.h"

#ifdef ROLLPACK_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/replay_kernels_cuda.h"
#endif

using rollpack::ArrayRef;
using rollpack::DeviceBatch;
using rollpack::DeviceStream;
namespace k = rollpack::kernels;

namespace {

thread_local std::string g_error;
thread_local int64_t g_resume_from = -1;

int Fail(const absl::Status& s) {
  g_error = std::string(s.message());
  g_resume_from = rollpack::ResumeFrom(s).value_or(-1);
  return s.ok() ? 0 : static_cast<int>(s.code());
}

int Ret(const k::KernelStatus& s) {
  g_error = s.message;
  g_resume_from = -1;
  return static_cast<int>(s.code);
}

using BatchHandle = std::shared_ptr<DeviceBatch>;
const DeviceBatch& B(void* h) { return **static_cast<BatchHandle*>(h); }

// DLPack (v0.8 ABI, the one every framework reads as a "dltensor" capsule).
struct DLDevice {
  int32_t device_type;  // 1 = CPU, 2 = CUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

struct Managed {
  DLManagedTensor t;
  BatchHandle owner;
  std::vector<int64_t> shape, strides;
};

void DeleteManaged(DLManagedTensor* t) { delete static_cast<Managed*>(t->manager_ctx); }

bool DType(rollpack::v1::DType d, DLDataType* out) {
  using namespace rollpack::v1;
  switch (d) {
    case UINT8: *out = {1, 8, 1}; return true;
    case UINT16: *out = {0, 16, 1}; return true;  // as int16: torch < 2.3 has no uint16
    case INT16: *out = {0, 16, 1}; return true;
    case INT32: *out = {0, 32, 1}; return true;
    case INT64: *out = {0, 64, 1}; return true;
    case FLOAT32: *out = {2, 32, 1}; return true;
    case FLOAT64: *out = {2, 64, 1}; return true;
    case FLOAT16: *out = {2, 16, 1}; return true;
    case BFLOAT16: *out = {4, 16, 1}; return true;
    default: return false;
  }
}

// The batch's array of a rpt_batch_dlpack name; nullptr for an unknown one.
const ArrayRef* FindArray(const DeviceBatch& b, const std::string& n) {
  if (n == "tokens") return &b.tokens();
  if (n == "cu_seqlens") return &b.cu_seqlens();
  if (n == "cu_seqlens_padded") return &b.cu_seqlens_padded();
  if (n == "replay_experts") return &b.replay_experts();
  if (n == "replay_mask") return &b.replay_mask();
  if (n == "replay_ids") return &b.replay_ids();
  if (n == "advantages") return &b.advantages();
  for (const bool values : {true, false}) {
    const absl::string_view prefix =
        values ? rollpack::kRaggedValuesPrefix : rollpack::kRaggedOffsetsPrefix;
    if (n.rfind(prefix.data(), 0, prefix.size()) != 0) continue;
    auto it = b.ragged_token_fields().find(n.substr(prefix.size()));
    if (it == b.ragged_token_fields().end()) return nullptr;
    return values ? &it->second.values : &it->second.offsets;
  }
  const std::map<std::string, ArrayRef>* named = nullptr;
  size_t prefix = 0;
  if (n.rfind("field:", 0) == 0) {
    named = &b.token_fields();
    prefix = 6;
  } else if (n.rfind("scalar:", 0) == 0) {
    named = &b.scalars();
    prefix = 7;
  }
  if (named == nullptr) return nullptr;
  auto it = named->find(n.substr(prefix));
  return it != named->end() ? &it->second : nullptr;
}

k::IndexView View(const void* data, int type, int64_t row_stride, int64_t layer_stride) {
  return {data, k::IndexType(type), row_stride, layer_stride};
}

#ifdef ROLLPACK_WITH_CUDA
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&prev_);
    changed_ = prev_ != device;
    if (changed_) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool changed_ = false;
};
#endif

// The caller's struct may come from an older header: only its first
// struct_size bytes are read, the rest stays zero ("off").
absl::StatusOr<rollpack::ClientOptions> ConnectOptions(const rpt_connect_options* c) {
  rollpack::ClientOptions o;
  if (c == nullptr) return o;
  if (c->struct_size < sizeof(uint32_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpt_connect_options.struct_size is ", c->struct_size,
        ": set it to sizeof(rpt_connect_options) = ", sizeof(rpt_connect_options)));
  }
  rpt_connect_options in;
  std::memset(&in, 0, sizeof(in));
  std::memcpy(&in, c, std::min<size_t>(c->struct_size, sizeof(in)));
  auto str = [](const char* p) { return p != nullptr ? std::string(p) : std::string(); };
  o.auth_token = str(in.auth_token);
  o.tls = in.tls != 0;
  o.tls_root_certs_pem = str(in.tls_root_certs_pem);
  o.tls_client_cert_pem = str(in.tls_client_cert_pem);
  o.tls_client_key_pem = str(in.tls_client_key_pem);
  o.tls_server_name = str(in.tls_server_name);
  if (o.tls_client_cert_pem.empty() != o.tls_client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpt_connect_options: tls_client_cert_pem is ",
                     o.tls_client_cert_pem.empty() ? "empty" : "set", " but tls_client_key_pem is ",
                     o.tls_client_key_pem.empty() ? "empty" : "set",
                     " (mutual TLS needs both)"));
  }
  return o;
}

// Every field up to rendezvous_tag exists since ABI 3: a shorter struct is
// not from any header, so it is refused rather than read as zeros (device 0
// would be a real GPU).
constexpr size_t kStreamOptionsAbi3 =
    offsetof(rpt_stream_options, rendezvous_tag) + sizeof(const char*);

absl::StatusOr<rollpack::DeviceStreamOptions> StreamOptions(const rpt_stream_options* p,
                                                            rollpack::v1::RankCoords* rank) {
  if (p == nullptr) return absl::InvalidArgumentError("rpt_stream_options is NULL");
  if (p->struct_size < kStreamOptionsAbi3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rpt_stream_options.struct_size is ", p->struct_size,
        ": set it to sizeof(rpt_stream_options) = ", sizeof(rpt_stream_options)));
  }
  rpt_stream_options in;
  std::memset(&in, 0, sizeof(in));
  std::memcpy(&in, p, std::min<size_t>(p->struct_size, sizeof(in)));
  rank->set_dp(in.dp);
  rank->set_cp(in.cp);
  rank->set_tp(in.tp);
  rank->set_pp(in.pp);
  rollpack::DeviceStreamOptions o;
  o.device = in.device;
  o.prefetch = in.prefetch;
  o.all_fields = in.all_fields != 0;
  o.start_index = in.start_index;
  o.ids_int32 = in.ids_int32 != 0;
  o.replay_ids = in.skip_replay_ids == 0;
  o.masked_fill_minus_one = in.masked_fill_minus_one != 0;
  o.tp_leader_size = in.tp_leader_size;
  if (in.rendezvous_timeout_s > 0) o.rendezvous_timeout_s = in.rendezvous_timeout_s;
  if (in.rendezvous_tag != nullptr) o.rendezvous_tag = in.rendezvous_tag;
  // Zero (also what an older caller's shorter struct reads as) keeps
  // DeviceStreamOptions' defaults.
  if (in.resume_timeout_ms < 0) o.resume_timeout = absl::InfiniteDuration();
  if (in.resume_timeout_ms > 0) o.resume_timeout = absl::Milliseconds(in.resume_timeout_ms);
  if (in.max_resumes != 0) o.max_resumes = in.max_resumes < 0 ? 0 : in.max_resumes;
  if (in.connect_grace_ms < 0) o.connect_grace = absl::InfiniteDuration();
  if (in.connect_grace_ms > 0) o.connect_grace = absl::Milliseconds(in.connect_grace_ms);
  switch (in.delivery) {
    case RPT_DELIVERY_AUTO: o.delivery = rollpack::Delivery::kAuto; break;
    case RPT_DELIVERY_DIRECT: o.delivery = rollpack::Delivery::kDirect; break;
    case RPT_DELIVERY_PROXY: o.delivery = rollpack::Delivery::kProxy; break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "rpt_stream_options.delivery is ", in.delivery,
          ": RPT_DELIVERY_AUTO (0), RPT_DELIVERY_DIRECT (1) or RPT_DELIVERY_PROXY (2)"));
  }
  return o;
}

[[maybe_unused]] int NoCuda() {
  g_error = "librollpack_trainer was built without CUDA";
  g_resume_from = -1;
  return static_cast<int>(k::StatusCode::kInvalidArgument);
}

k::ApplyArgs MakeApply(const void* logits, int logits_type, const void* ids, int ids_type,
                       int64_t ids_row_stride, int64_t rows, int e, int kk, int score, int renorm,
                       float scale) {
  k::ApplyArgs a;
  a.logits = logits;
  a.logits_type = k::FloatType(logits_type);
  a.ids = View(ids, ids_type, ids_row_stride, 0);
  a.rows = rows;
  a.experts = e;
  a.k = kk;
  a.score = k::ScoreFunction(score);
  a.renormalize = renorm != 0;
  a.scale = scale;
  return a;
}

}  // namespace

extern "C" {

int rpt_abi_version(void) { return RPT_ABI_VERSION; }
const char* rpt_last_error(void) { return g_error.c_str(); }
int64_t rpt_last_resume_from(void) { return g_resume_from; }
int rpt_has_cuda(void) { return rollpack::DeviceStreamHasCuda() ? 1 : 0; }

void rpt_close_tp_communicators(void) { rollpack::CloseTpCommunicators(); }

int rpt_stream_open(const char* address, const rpt_connect_options* connect,
                    const char* step_id, const rpt_stream_options* options, void** out_stream) {
  *out_stream = nullptr;
  absl::StatusOr<rollpack::ClientOptions> connection = ConnectOptions(connect);
  if (!connection.ok()) return Fail(connection.status());
  rollpack::v1::RankCoords rank;
  absl::StatusOr<rollpack::DeviceStreamOptions> o = StreamOptions(options, &rank);
  if (!o.ok()) return Fail(o.status());
  o->auth_token = connection->auth_token;
  o->target = address;
  o->tls = connection->tls || !connection->tls_root_certs_pem.empty() ||
           !connection->tls_client_cert_pem.empty();
  absl::StatusOr<std::unique_ptr<DeviceStream>> s =
      DeviceStream::Open(rollpack::MakeChannel(address, *connection), step_id, rank, *o);
  if (!s.ok()) return Fail(s.status());
  *out_stream = s->release();
  return 0;
}

int rpt_next(void* stream, void* consumer_stream, void** out_batch) {
  *out_batch = nullptr;
  absl::StatusOr<std::shared_ptr<DeviceBatch>> b =
      static_cast<DeviceStream*>(stream)->Next(consumer_stream);
  if (!b.ok()) return Fail(b.status());
  if (*b != nullptr) *out_batch = new BatchHandle(*std::move(b));
  return 0;
}

void rpt_close(void* stream) { delete static_cast<DeviceStream*>(stream); }

int rpt_client_open(const char* address, const rpt_connect_options* connect, void** out_client) {
  *out_client = nullptr;
  absl::StatusOr<rollpack::ClientOptions> o = ConnectOptions(connect);
  if (!o.ok()) return Fail(o.status());
  *out_client = new rollpack::RollpackClient(rollpack::MakeChannel(address, *o), *o);
  return 0;
}

void rpt_client_close(void* client) { delete static_cast<rollpack::RollpackClient*>(client); }

int rpt_report_routing_agreement(void* client, const char* step_id, int dp, int cp, int tp,
                                 int pp, int topk, int num_layers, const int32_t* layers,
                                 const int64_t* stats, int64_t* out_totals) {
  if (num_layers < 0 || (num_layers > 0 && (layers == nullptr || stats == nullptr))) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "num_layers is ", num_layers, " with layers ", layers == nullptr ? "NULL" : "set",
        " and stats ", stats == nullptr ? "NULL" : "set")));
  }
  rollpack::v1::RoutingAgreementReport report;
  report.set_step_id(step_id != nullptr ? step_id : "");
  report.mutable_rank()->set_dp(dp);
  report.mutable_rank()->set_cp(cp);
  report.mutable_rank()->set_tp(tp);
  report.mutable_rank()->set_pp(pp);
  report.set_topk(topk);
  for (int i = 0; i < num_layers; ++i) {
    rollpack::v1::LayerAgreement* l = report.add_layers();
    l->set_layer(layers[i]);
    l->set_rows_compared(stats[3 * i]);
    l->set_rows_disagreeing(stats[3 * i + 1]);
    l->set_overlapping_experts(stats[3 * i + 2]);
  }
  absl::StatusOr<rollpack::v1::RoutingAgreementAck> ack =
      static_cast<rollpack::RollpackClient*>(client)->ReportRoutingAgreement(report);
  if (!ack.ok()) return Fail(ack.status());
  if (out_totals != nullptr) {
    out_totals[0] = ack->step_rows_compared();
    out_totals[1] = ack->step_rows_disagreeing();
    out_totals[2] = ack->step_overlapping_experts();
    out_totals[3] = ack->step_reports();
  }
  return 0;
}

void rpt_batch_free(void* batch) { delete static_cast<BatchHandle*>(batch); }

int64_t rpt_batch_int(void* batch, const char* name) {
  const DeviceBatch& b = B(batch);
  const std::string n = name;
  if (n == "index") return b.meta().index();
  if (n == "num_microbatches") return b.meta().num_microbatches();
  if (n == "local_cp_size") return b.meta().local_cp_size();
  if (n == "local_cp_rank") return b.meta().local_cp_rank();
  if (n == "max_seqlen") return b.meta().max_seqlen();
  if (n == "device") return b.device();
  return -1;
}

double rpt_batch_workload(void* batch) { return B(batch).meta().workload(); }
const char* rpt_batch_step_id(void* batch) { return B(batch).meta().step_id().c_str(); }
int rpt_batch_num_samples(void* batch) { return B(batch).meta().sample_ids_size(); }
const char* rpt_batch_sample_id(void* batch, int i) {
  return B(batch).meta().sample_ids(i).c_str();
}
int rpt_batch_num_layers(void* batch) { return B(batch).meta().replay_layers_size(); }
int rpt_batch_layer(void* batch, int i) { return B(batch).meta().replay_layers(i); }
int rpt_batch_num_fields(void* batch) { return static_cast<int>(B(batch).token_fields().size()); }
const char* rpt_batch_field_name(void* batch, int i) {
  auto it = B(batch).token_fields().begin();
  std::advance(it, i);
  return it->first.c_str();
}

int rpt_batch_num_group_ids(void* batch) { return B(batch).meta().group_ids_size(); }
const char* rpt_batch_group_id(void* batch, int i) {
  const rollpack::v1::Microbatch& m = B(batch).meta();
  return i >= 0 && i < m.group_ids_size() ? m.group_ids(i).c_str() : nullptr;
}
const int64_t* rpt_batch_policy_versions(void* batch) {
  const rollpack::v1::Microbatch& m = B(batch).meta();
  return m.policy_versions_size() > 0 ? m.policy_versions().data() : nullptr;
}
int rpt_batch_num_scalars(void* batch) { return static_cast<int>(B(batch).scalars().size()); }
const char* rpt_batch_scalar_name(void* batch, int i) {
  const auto& scalars = B(batch).scalars();
  if (i < 0 || i >= static_cast<int>(scalars.size())) return nullptr;
  auto it = scalars.begin();
  std::advance(it, i);
  return it->first.c_str();
}

int rpt_batch_num_ragged_fields(void* batch) {
  return static_cast<int>(B(batch).ragged_token_fields().size());
}
const char* rpt_batch_ragged_field_name(void* batch, int i) {
  const auto& fields = B(batch).ragged_token_fields();
  if (i < 0 || i >= static_cast<int>(fields.size())) return nullptr;
  auto it = fields.begin();
  std::advance(it, i);
  return it->first.c_str();
}

int rpt_batch_has_array(void* batch, const char* name) {
  const ArrayRef* r = FindArray(B(batch), name);
  return r != nullptr && r->dtype != rollpack::v1::DTYPE_UNSPECIFIED ? 1 : 0;
}

void* rpt_batch_dlpack(void* batch, const char* name) {
  const DeviceBatch& b = B(batch);
  const std::string n = name;
  const ArrayRef* r = FindArray(b, n);
  if (r == nullptr) {
    g_error = "no array named " + n;
    g_resume_from = -1;
    return nullptr;
  }
  auto* m = new Managed();
  m->owner = *static_cast<BatchHandle*>(batch);
  DLDataType dt{1, 8, 1};
  if (r->dtype != rollpack::v1::DTYPE_UNSPECIFIED && !DType(r->dtype, &dt)) {
    delete m;
    g_error = "unsupported dtype for " + n;
    g_resume_from = -1;
    return nullptr;
  }
  m->shape = r->shape;
  if (r->dtype == rollpack::v1::DTYPE_UNSPECIFIED) m->shape = {0};  // absent array
  m->strides.assign(m->shape.size(), 1);
  for (int i = static_cast<int>(m->shape.size()) - 2; i >= 0; --i) {
    m->strides[i] = m->strides[i + 1] * std::max<int64_t>(m->shape[i + 1], 1);
  }
  static int64_t dummy[2] = {0, 0};
  m->t.dl_tensor.data = r->data != nullptr ? r->data : static_cast<void*>(dummy);
  if (b.device() >= 0 && r->data == nullptr) {
    // Empty device array: any device address works; take the ids buffer's.
    m->t.dl_tensor.data = b.replay_ids().data != nullptr ? b.replay_ids().data
                                                         : b.cu_seqlens().data;
  }
  m->t.dl_tensor.device = {b.device() >= 0 ? 2 : 1, b.device() >= 0 ? b.device() : 0};
  m->t.dl_tensor.ndim = static_cast<int32_t>(m->shape.size());
  m->t.dl_tensor.dtype = dt;
  m->t.dl_tensor.shape = m->shape.data();
  m->t.dl_tensor.strides = m->strides.data();
  m->t.dl_tensor.byte_offset = 0;
  m->t.manager_ctx = m;
  m->t.deleter = &DeleteManaged;
  return &m->t;
}

void rpt_dlpack_free(void* managed) {
  auto* t = static_cast<DLManagedTensor*>(managed);
  if (t != nullptr && t->deleter != nullptr) t->deleter(t);
}

int rpt_unpack(int device, const void* experts, int in_type, const uint8_t* mask, int64_t rows,
               int64_t layers, int kk, void* out, int out_type, int masked_fill_minus_one,
               void* stream) {
  k::UnpackArgs a;
  a.experts = experts;
  a.in_type = k::IndexType(in_type);
  a.mask = mask;
  a.rows = rows;
  a.layers = layers;
  a.k = kk;
  a.out = out;
  a.out_type = k::OutIndexType(out_type);
  a.masked_fill_minus_one = masked_fill_minus_one != 0;
  if (device < 0) return Ret(k::cpu::Unpack(a));
#ifdef ROLLPACK_WITH_CUDA
  DeviceGuard g(device);
  return Ret(k::cuda::Unpack(a, stream));
#else
  return NoCuda();
#endif
}

int rpt_apply_forward(int device, const void* logits, int logits_type, const void* ids,
                      int ids_type, int64_t ids_row_stride, int64_t rows, int e, int kk, int score,
                      int renormalize, float scale, float* probs, uint8_t* routing_map,
                      float* probs_dense, void* stream) {
  k::ApplyArgs a = MakeApply(logits, logits_type, ids, ids_type, ids_row_stride, rows, e, kk,
                             score, renormalize, scale);
  k::ApplyForwardOut out{probs, routing_map, probs_dense};
  if (device < 0) return Ret(k::cpu::ApplyForward(a, out));
#ifdef ROLLPACK_WITH_CUDA
  DeviceGuard g(device);
  return Ret(k::cuda::ApplyForward(a, out, stream));
#else
  return NoCuda();
#endif
}

int rpt_apply_backward(int device, const void* logits, int logits_type, const void* ids,
                       int ids_type, int64_t ids_row_stride, int64_t rows, int e, int kk,
                       int score, int renormalize, float scale, const float* grad_probs,
                       void* grad_logits, void* stream) {
  k::ApplyArgs a = MakeApply(logits, logits_type, ids, ids_type, ids_row_stride, rows, e, kk,
                             score, renormalize, scale);
  if (device < 0) return Ret(k::cpu::ApplyBackward(a, grad_probs, grad_logits));
#ifdef ROLLPACK_WITH_CUDA
  DeviceGuard g(device);
  return Ret(k::cuda::ApplyBackward(a, grad_probs, grad_logits, stream));
#else
  return NoCuda();
#endif
}

int rpt_agreement_logits(int device, const void* logits, int logits_type,
                         int64_t logits_layer_stride, const void* replay, int replay_type,
                         int64_t replay_row_stride, int64_t replay_layer_stride,
                         const uint8_t* mask, int64_t rows, int64_t layers, int e, int kk,
                         int64_t* stats, void* stream) {
  static_assert(sizeof(k::AgreementStats) == 3 * sizeof(int64_t), "stats layout");
  k::AgreementLogitsArgs a;
  a.logits = logits;
  a.logits_type = k::FloatType(logits_type);
  a.logits_layer_stride = logits_layer_stride;
  a.replay = View(replay, replay_type, replay_row_stride, replay_layer_stride);
  a.mask = mask;
  a.rows = rows;
  a.layers = layers;
  a.experts = e;
  a.k = kk;
  auto* s = reinterpret_cast<k::AgreementStats*>(stats);
  if (device < 0) return Ret(k::cpu::AgreementFromLogits(a, s));
#ifdef ROLLPACK_WITH_CUDA
  DeviceGuard g(device);
  return Ret(k::cuda::AgreementFromLogits(a, s, stream));
#else
  return NoCuda();
#endif
}

int rpt_agreement_ids(int device, const void* live, int live_type, int64_t live_row_stride,
                      int64_t live_layer_stride, const void* replay, int replay_type,
                      int64_t replay_row_stride, int64_t replay_layer_stride, const uint8_t* mask,
                      int64_t rows, int64_t layers, int kk, int64_t* stats, void* stream) {
  k::AgreementIdsArgs a;
  a.live = View(live, live_type, live_row_stride, live_layer_stride);
  a.replay = View(replay, replay_type, replay_row_stride, replay_layer_stride);
  a.mask = mask;
  a.rows = rows;
  a.layers = layers;
  a.k = kk;
  auto* s = reinterpret_cast<k::AgreementStats*>(stats);
  if (device < 0) return Ret(k::cpu::AgreementFromIds(a, s));
#ifdef ROLLPACK_WITH_CUDA
  DeviceGuard g(device);
  return Ret(k::cuda::AgreementFromIds(a, s, stream));
#else
  return NoCuda();
#endif
}

int rpt_unpack_static(int device, const void* experts, int in_type, const uint8_t* mask,
                      int64_t rows, const int64_t* rows_ptr, int64_t layers, int kk,
                      int num_experts, void* out, int out_type, int64_t max_rows,
                      int64_t out_row_stride, int64_t out_layer_stride,
                      int masked_fill_minus_one, void* stream) {
  k::StaticUnpackArgs a;
  a.experts = experts;
  a.in_type = k::IndexType(in_type);
  a.mask = mask;
  a.rows = rows;
  a.rows_ptr = rows_ptr;
  a.layers = layers;
  a.k = kk;
  a.num_experts = num_experts;
  a.out = out;
  a.out_type = k::OutIndexType(out_type);
  a.max_rows = max_rows;
  a.out_row_stride = out_row_stride;
  a.out_layer_stride = out_layer_stride;
  a.masked_fill_minus_one = masked_fill_minus_one != 0;
  if (device < 0) return Ret(k::cpu::StaticUnpack(a));
#ifdef ROLLPACK_WITH_CUDA
  DeviceGuard g(device);
  return Ret(k::cuda::StaticUnpack(a, stream));
#else
  return NoCuda();
#endif
}

int rpt_store_rows(int device, int64_t* rows_ptr, int64_t rows, void* stream) {
  if (device < 0) {
    if (rows_ptr == nullptr || rows < 0) {
      return Ret(k::KernelStatus::InvalidArgument(
          rows_ptr == nullptr ? std::string("null rows_ptr")
                              : "rows must be >= 0, got " + std::to_string(rows)));
    }
    *rows_ptr = rows;
    return Ret(k::KernelStatus::Ok());
  }
#ifdef ROLLPACK_WITH_CUDA
  DeviceGuard g(device);
  return Ret(k::cuda::StoreRows(rows_ptr, rows, stream));
#else
  return NoCuda();
#endif
}

int rpt_stage_static(int device, const void* experts, int in_type, const uint8_t* mask,
                     int64_t rows, int64_t layers, int kk, int index, void* staging_experts,
                     int staging_type, uint8_t* staging_mask, int64_t* staging_rows,
                     int64_t max_rows, void* stream) {
  auto u16 = [](int type, const char* what) -> absl::StatusOr<bool> {
    if (type == 0 || type == 1) return type == 1;
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", type, ": 0 (uint8) or 1 (uint16)"));
  };
  absl::StatusOr<bool> in16 = u16(in_type, "in_type");
  if (!in16.ok()) return Fail(in16.status());
  absl::StatusOr<bool> st16 = u16(staging_type, "staging_type");
  if (!st16.ok()) return Fail(st16.status());
  rollpack::ReceivedIds ids;
  ids.experts = experts;
  ids.uint16 = *in16;
  ids.mask = mask;
  ids.rows = rows;
  ids.layers = layers;
  ids.k = kk;
  ids.index = index;
  rollpack::StaticStaging staging;
  staging.experts = staging_experts;
  staging.uint16 = *st16;
  staging.mask = staging_mask;
  staging.rows = staging_rows;
  staging.max_rows = max_rows;
  staging.layers = layers;
  staging.k = kk;
  return Fail(rollpack::StageReplayTargets(ids, staging, device, stream));
}

}  // extern "C"
