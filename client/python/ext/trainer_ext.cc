// rollpack._trainer: the pybind11 binding of librollpack_trainer.so's C ABI
// (client/cpp/trainer_capi.h). Deliberately thin: handles and pointers are
// Python ints, arrays leave as DLPack "dltensor" capsules, so it links
// neither libtorch nor gRPC and builds in seconds wherever Python's headers
// are (client/python/device/build_on_device.sh builds it on the GPU machine).
// Errors raise RuntimeError(code, message); rollpack.trainer maps the code to
// rollpack.errors classes. The same functions exist over ctypes in
// rollpack/_capi.py for Pythons without headers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "client/cpp/trainer_capi.h"

namespace py = pybind11;

namespace {

[[noreturn]] void Raise(int rc) {
  PyErr_SetObject(PyExc_RuntimeError, py::make_tuple(rc, std::string(rpt_last_error())).ptr());
  throw py::error_already_set();
}
void Check(int rc) {
  if (rc != 0) Raise(rc);
}

void* P(uintptr_t p) { return reinterpret_cast<void*>(p); }

// rpt_connect_options from rollpack.trainer's tuple (auth_token, tls,
// root_certs_pem, client_cert_pem, client_key_pem, server_name), or None;
// owns the strings the options point into.
class Connect {
 public:
  explicit Connect(const py::object& t) {
    std::memset(&opts_, 0, sizeof(opts_));
    opts_.struct_size = sizeof(opts_);
    if (t.is_none()) return;
    const py::tuple v = t.cast<py::tuple>();
    if (v.size() != 6) throw py::value_error("connect: want a 6-tuple");
    auto str = [&](int i) { return v[i].is_none() ? std::string() : v[i].cast<std::string>(); };
    token_ = str(0);
    opts_.tls = v[1].cast<bool>() ? 1 : 0;
    root_ = str(2);
    cert_ = str(3);
    key_ = str(4);
    name_ = str(5);
    opts_.auth_token = token_.c_str();
    opts_.tls_root_certs_pem = root_.c_str();
    opts_.tls_client_cert_pem = cert_.c_str();
    opts_.tls_client_key_pem = key_.c_str();
    opts_.tls_server_name = name_.c_str();
  }
  Connect(const Connect&) = delete;
  Connect& operator=(const Connect&) = delete;
  const rpt_connect_options* get() const { return &opts_; }

 private:
  std::string token_, root_, cert_, key_, name_;
  rpt_connect_options opts_;
};

void CapsuleDestructor(PyObject* capsule) {
  // Consumed capsules are renamed "used_dltensor" by the consumer.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    rpt_dlpack_free(PyCapsule_GetPointer(capsule, "dltensor"));
  }
}

}  // namespace

PYBIND11_MODULE(_trainer, m) {
  m.doc() = "rollpack trainer client (C ABI binding); use rollpack.trainer";
  m.def("abi_version", &rpt_abi_version);
  m.def("has_cuda", [] { return rpt_has_cuda() != 0; });
  m.def("close_tp_communicators", [] { rpt_close_tp_communicators(); });
  m.def("open", [](const std::string& address, const std::string& step_id, int dp, int cp, int tp,
                   int pp, int device, int prefetch, bool all_fields, int start_index,
                   bool ids_int32, bool fill, int tp_leader_size, int rendezvous_timeout_s,
                   const std::string& rendezvous_tag, const py::object& connect) {
    const Connect c(connect);
    void* s = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = rpt_open2(address.c_str(), c.get(), step_id.c_str(), dp, cp, tp, pp, device, prefetch,
                     all_fields, start_index, ids_int32, fill, tp_leader_size,
                     rendezvous_timeout_s, rendezvous_tag.c_str(), &s);
    }
    Check(rc);
    return reinterpret_cast<uintptr_t>(s);
  }, py::arg("address"), py::arg("step_id"), py::arg("dp"), py::arg("cp"), py::arg("tp"),
     py::arg("pp"), py::arg("device"), py::arg("prefetch"), py::arg("all_fields"),
     py::arg("start_index"), py::arg("ids_int32"), py::arg("fill"), py::arg("tp_leader_size"),
     py::arg("rendezvous_timeout_s"), py::arg("rendezvous_tag"), py::arg("connect") = py::none());
  m.def("client_open", [](const std::string& address, const py::object& connect) {
    const Connect c(connect);
    void* client = nullptr;
    Check(rpt_client_open(address.c_str(), c.get(), &client));
    return reinterpret_cast<uintptr_t>(client);
  });
  m.def("client_close", [](uintptr_t client) { rpt_client_close(P(client)); });
  m.def("report_routing_agreement", [](uintptr_t client, const std::string& step_id, int dp,
                                       int cp, int tp, int pp, int topk,
                                       const std::vector<int32_t>& layers,
                                       const std::vector<int64_t>& stats) {
    if (stats.size() != 3 * layers.size()) {
      throw py::value_error("stats must hold 3 counts per layer");
    }
    int64_t totals[4] = {0, 0, 0, 0};
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = rpt_report_routing_agreement(P(client), step_id.c_str(), dp, cp, tp, pp, topk,
                                        static_cast<int>(layers.size()), layers.data(),
                                        stats.data(), totals);
    }
    Check(rc);
    return py::make_tuple(totals[0], totals[1], totals[2], totals[3]);
  });
  m.def("next", [](uintptr_t stream, uintptr_t consumer_stream) {
    void* b = nullptr;
    int rc;
    {
      py::gil_scoped_release nogil;
      rc = rpt_next(P(stream), P(consumer_stream), &b);
    }
    Check(rc);
    return reinterpret_cast<uintptr_t>(b);
  });
  m.def("close", [](uintptr_t stream) {
    py::gil_scoped_release nogil;
    rpt_close(P(stream));
  });
  m.def("batch_free", [](uintptr_t b) { rpt_batch_free(P(b)); });
  m.def("batch_int", [](uintptr_t b, const std::string& name) {
    return rpt_batch_int(P(b), name.c_str());
  });
  m.def("batch_workload", [](uintptr_t b) { return rpt_batch_workload(P(b)); });
  m.def("batch_step_id", [](uintptr_t b) { return std::string(rpt_batch_step_id(P(b))); });
  m.def("batch_sample_ids", [](uintptr_t b) {
    std::vector<std::string> v;
    for (int i = 0; i < rpt_batch_num_samples(P(b)); ++i) v.push_back(rpt_batch_sample_id(P(b), i));
    return v;
  });
  m.def("batch_layers", [](uintptr_t b) {
    std::vector<int> v;
    for (int i = 0; i < rpt_batch_num_layers(P(b)); ++i) v.push_back(rpt_batch_layer(P(b), i));
    return v;
  });
  m.def("batch_fields", [](uintptr_t b) {
    std::vector<std::string> v;
    for (int i = 0; i < rpt_batch_num_fields(P(b)); ++i) v.push_back(rpt_batch_field_name(P(b), i));
    return v;
  });
  m.def("batch_dlpack", [](uintptr_t b, const std::string& name) {
    void* t = rpt_batch_dlpack(P(b), name.c_str());
    if (t == nullptr) Raise(3);
    return py::reinterpret_steal<py::object>(PyCapsule_New(t, "dltensor", &CapsuleDestructor));
  });
  m.def("unpack", [](int device, uintptr_t experts, int in_type, uintptr_t mask, int64_t rows,
                     int64_t layers, int k, uintptr_t out, int out_type, bool fill,
                     uintptr_t stream) {
    Check(rpt_unpack(device, P(experts), in_type, static_cast<const uint8_t*>(P(mask)), rows,
                     layers, k, P(out), out_type, fill, P(stream)));
  });
  m.def("apply_forward", [](int device, uintptr_t logits, int logits_type, uintptr_t ids,
                            int ids_type, int64_t ids_row_stride, int64_t rows, int e, int k,
                            int score, bool renorm, float scale, uintptr_t probs, uintptr_t map,
                            uintptr_t dense, uintptr_t stream) {
    Check(rpt_apply_forward(device, P(logits), logits_type, P(ids), ids_type, ids_row_stride, rows,
                            e, k, score, renorm, scale, static_cast<float*>(P(probs)),
                            static_cast<uint8_t*>(P(map)), static_cast<float*>(P(dense)),
                            P(stream)));
  });
  m.def("apply_backward", [](int device, uintptr_t logits, int logits_type, uintptr_t ids,
                             int ids_type, int64_t ids_row_stride, int64_t rows, int e, int k,
                             int score, bool renorm, float scale, uintptr_t grad_probs,
                             uintptr_t grad_logits, uintptr_t stream) {
    Check(rpt_apply_backward(device, P(logits), logits_type, P(ids), ids_type, ids_row_stride,
                             rows, e, k, score, renorm, scale,
                             static_cast<const float*>(P(grad_probs)), P(grad_logits), P(stream)));
  });
  m.def("agreement_logits", [](int device, uintptr_t logits, int logits_type,
                               int64_t logits_layer_stride, uintptr_t replay, int replay_type,
                               int64_t replay_row_stride, int64_t replay_layer_stride,
                               uintptr_t mask, int64_t rows, int64_t layers, int e, int k,
                               uintptr_t stats, uintptr_t stream) {
    Check(rpt_agreement_logits(device, P(logits), logits_type, logits_layer_stride, P(replay),
                               replay_type, replay_row_stride, replay_layer_stride,
                               static_cast<const uint8_t*>(P(mask)), rows, layers, e, k,
                               static_cast<int64_t*>(P(stats)), P(stream)));
  });
  m.def("agreement_ids", [](int device, uintptr_t live, int live_type, int64_t live_row_stride,
                            int64_t live_layer_stride, uintptr_t replay, int replay_type,
                            int64_t replay_row_stride, int64_t replay_layer_stride, uintptr_t mask,
                            int64_t rows, int64_t layers, int k, uintptr_t stats,
                            uintptr_t stream) {
    Check(rpt_agreement_ids(device, P(live), live_type, live_row_stride, live_layer_stride,
                            P(replay), replay_type, replay_row_stride, replay_layer_stride,
                            static_cast<const uint8_t*>(P(mask)), rows, layers, k,
                            static_cast<int64_t*>(P(stats)), P(stream)));
  });
}
