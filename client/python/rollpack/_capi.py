"""ctypes binding of librollpack_trainer.so, with the same functions as the
pybind11 extension ``rollpack._trainer`` (client/python/ext/trainer_ext.cc).

Used when the extension is not importable (e.g. a Python without headers,
where it could not be built); rollpack.trainer picks the extension first.
The library is $ROLLPACK_TRAINER_LIBRARY, else librollpack_trainer.so next to
this file. Errors raise RuntimeError(code, message) like the extension.
"""

import ctypes
import os

_LIB = None
_c = ctypes
_P = _c.c_void_p
_I = _c.c_int
_L = _c.c_int64
_F = _c.c_float


class ConnectOptions(ctypes.Structure):
    """rpt_connect_options (trainer_capi.h); struct_size versions it."""
    _fields_ = [("struct_size", _c.c_uint32), ("auth_token", _c.c_char_p), ("tls", _I),
                ("tls_root_certs_pem", _c.c_char_p), ("tls_client_cert_pem", _c.c_char_p),
                ("tls_client_key_pem", _c.c_char_p), ("tls_server_name", _c.c_char_p)]


_SIGS = {
    "rpt_abi_version": (_I, []),
    "rpt_last_error": (_c.c_char_p, []),
    "rpt_has_cuda": (_I, []),
    "rpt_close_tp_communicators": (None, []),
    "rpt_open": (_I, [_c.c_char_p, _c.c_char_p, _I, _I, _I, _I, _I, _I, _I, _I, _I, _I, _I, _I,
                      _c.c_char_p, _c.POINTER(_P)]),
    "rpt_open2": (_I, [_c.c_char_p, _c.POINTER(ConnectOptions), _c.c_char_p, _I, _I, _I, _I,
                       _I, _I, _I, _I, _I, _I, _I, _I, _c.c_char_p, _c.POINTER(_P)]),
    "rpt_next": (_I, [_P, _P, _c.POINTER(_P)]),
    "rpt_close": (None, [_P]),
    "rpt_client_open": (_I, [_c.c_char_p, _c.POINTER(ConnectOptions), _c.POINTER(_P)]),
    "rpt_client_close": (None, [_P]),
    "rpt_report_routing_agreement": (_I, [_P, _c.c_char_p, _I, _I, _I, _I, _I, _I,
                                          _c.POINTER(_c.c_int32), _c.POINTER(_L),
                                          _c.POINTER(_L)]),
    "rpt_batch_free": (None, [_P]),
    "rpt_batch_int": (_L, [_P, _c.c_char_p]),
    "rpt_batch_workload": (_c.c_double, [_P]),
    "rpt_batch_step_id": (_c.c_char_p, [_P]),
    "rpt_batch_num_samples": (_I, [_P]),
    "rpt_batch_sample_id": (_c.c_char_p, [_P, _I]),
    "rpt_batch_num_layers": (_I, [_P]),
    "rpt_batch_layer": (_I, [_P, _I]),
    "rpt_batch_num_fields": (_I, [_P]),
    "rpt_batch_field_name": (_c.c_char_p, [_P, _I]),
    "rpt_batch_dlpack": (_P, [_P, _c.c_char_p]),
    "rpt_dlpack_free": (None, [_P]),
    "rpt_unpack": (_I, [_I, _P, _I, _P, _L, _L, _I, _P, _I, _I, _P]),
    "rpt_apply_forward": (_I, [_I, _P, _I, _P, _I, _L, _L, _I, _I, _I, _I, _F, _P, _P, _P, _P]),
    "rpt_apply_backward": (_I, [_I, _P, _I, _P, _I, _L, _L, _I, _I, _I, _I, _F, _P, _P, _P]),
    "rpt_agreement_logits": (_I, [_I, _P, _I, _L, _P, _I, _L, _L, _P, _L, _L, _I, _I, _P, _P]),
    "rpt_agreement_ids": (_I, [_I, _P, _I, _L, _L, _P, _I, _L, _L, _P, _L, _L, _I, _P, _P]),
}


def library_path():
    env = os.environ.get("ROLLPACK_TRAINER_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "librollpack_trainer.so")


def _lib():
    global _LIB
    if _LIB is None:
        path = library_path()
        if not os.path.exists(path):
            raise ImportError("rollpack: %s is missing: build the target rollpack_trainer "
                              "(docs/trainer.md)" % path)
        lib = ctypes.CDLL(path)
        for name, (res, args) in _SIGS.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise ImportError("rollpack: %s has no %s: it is older than this package; "
                                  "rebuild the target rollpack_trainer" % (path, name)) from None
            fn.restype = res
            fn.argtypes = args
        _LIB = lib
    return _LIB


def _check(rc):
    if rc != 0:
        raise RuntimeError(rc, _lib().rpt_last_error().decode(errors="replace"))


_pythonapi = ctypes.pythonapi
_pythonapi.PyCapsule_New.restype = ctypes.py_object
_pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR = ctypes.c_char_p(b"dltensor")  # must outlive every capsule


def abi_version():
    return _lib().rpt_abi_version()


def has_cuda():
    return bool(_lib().rpt_has_cuda())


def close_tp_communicators():
    _lib().rpt_close_tp_communicators()


def _bytes(x):
    if x is None:
        return None
    return x if isinstance(x, bytes) else str(x).encode()


def _connect(connect):
    """(auth_token, tls, root_certs_pem, client_cert_pem, client_key_pem,
    server_name) or None -> a ConnectOptions (its bytes objects are kept
    alive by the structure's _objects while it lives)."""
    o = ConnectOptions()
    o.struct_size = ctypes.sizeof(ConnectOptions)
    if connect is not None:
        token, tls, root, cert, key, name = connect
        o.auth_token, o.tls = _bytes(token), int(bool(tls))
        o.tls_root_certs_pem, o.tls_client_cert_pem = _bytes(root), _bytes(cert)
        o.tls_client_key_pem, o.tls_server_name = _bytes(key), _bytes(name)
    return o


def open(address, step_id, dp, cp, tp, pp, device, prefetch, all_fields, start_index, ids_int32,
         fill, tp_leader_size, rendezvous_timeout_s, rendezvous_tag, connect=None):  # noqa: A001
    out = _P()
    c = _connect(connect)
    _check(_lib().rpt_open2(address.encode(), ctypes.byref(c), step_id.encode(), dp, cp, tp, pp,
                            device, prefetch, int(all_fields), start_index, int(ids_int32),
                            int(fill), tp_leader_size, rendezvous_timeout_s,
                            rendezvous_tag.encode(), ctypes.byref(out)))
    return out.value or 0


def client_open(address, connect=None):
    out = _P()
    c = _connect(connect)
    _check(_lib().rpt_client_open(address.encode(), ctypes.byref(c), ctypes.byref(out)))
    return out.value or 0


def client_close(client):
    _lib().rpt_client_close(client)


def report_routing_agreement(client, step_id, dp, cp, tp, pp, topk, layers, stats):
    n = len(layers)
    if len(stats) != 3 * n:
        raise ValueError("stats must hold 3 counts per layer")
    layer_arr = (_c.c_int32 * max(n, 1))(*layers)
    stats_arr = (_L * max(3 * n, 1))(*stats)
    totals = (_L * 4)()
    _check(_lib().rpt_report_routing_agreement(client, step_id.encode(), dp, cp, tp, pp, topk, n,
                                               layer_arr, stats_arr, totals))
    return tuple(totals)


def next(stream, consumer_stream):  # noqa: A001
    out = _P()
    _check(_lib().rpt_next(stream, consumer_stream or None, ctypes.byref(out)))
    return out.value or 0


def close(stream):
    _lib().rpt_close(stream)


def batch_free(b):
    _lib().rpt_batch_free(b)


def batch_int(b, name):
    return _lib().rpt_batch_int(b, name.encode())


def batch_workload(b):
    return _lib().rpt_batch_workload(b)


def batch_step_id(b):
    return _lib().rpt_batch_step_id(b).decode()


def batch_sample_ids(b):
    lib = _lib()
    return [lib.rpt_batch_sample_id(b, i).decode() for i in range(lib.rpt_batch_num_samples(b))]


def batch_layers(b):
    lib = _lib()
    return [lib.rpt_batch_layer(b, i) for i in range(lib.rpt_batch_num_layers(b))]


def batch_fields(b):
    lib = _lib()
    return [lib.rpt_batch_field_name(b, i).decode() for i in range(lib.rpt_batch_num_fields(b))]


def batch_dlpack(b, name):
    t = _lib().rpt_batch_dlpack(b, name.encode())
    if not t:
        _check(3)
    # No capsule destructor here (a ctypes callback would run inside GC):
    # rollpack.trainer consumes every capsule at once.
    return _pythonapi.PyCapsule_New(t, _DLTENSOR, None)


def unpack(device, experts, in_type, mask, rows, layers, k, out, out_type, fill, stream):
    _check(_lib().rpt_unpack(device, experts, in_type, mask or None, rows, layers, k, out,
                             out_type, int(fill), stream or None))


def apply_forward(device, logits, logits_type, ids, ids_type, ids_row_stride, rows, e, k, score,
                  renorm, scale, probs, rmap, dense, stream):
    _check(_lib().rpt_apply_forward(device, logits, logits_type, ids, ids_type, ids_row_stride,
                                    rows, e, k, score, int(renorm), scale, probs, rmap or None,
                                    dense or None, stream or None))


def apply_backward(device, logits, logits_type, ids, ids_type, ids_row_stride, rows, e, k, score,
                   renorm, scale, grad_probs, grad_logits, stream):
    _check(_lib().rpt_apply_backward(device, logits, logits_type, ids, ids_type, ids_row_stride,
                                     rows, e, k, score, int(renorm), scale, grad_probs,
                                     grad_logits, stream or None))


def agreement_logits(device, logits, logits_type, logits_layer_stride, replay, replay_type,
                     replay_row_stride, replay_layer_stride, mask, rows, layers, e, k, stats,
                     stream):
    _check(_lib().rpt_agreement_logits(device, logits, logits_type, logits_layer_stride, replay,
                                       replay_type, replay_row_stride, replay_layer_stride,
                                       mask or None, rows, layers, e, k, stats, stream or None))


def agreement_ids(device, live, live_type, live_row_stride, live_layer_stride, replay,
                  replay_type, replay_row_stride, replay_layer_stride, mask, rows, layers, k,
                  stats, stream):
    _check(_lib().rpt_agreement_ids(device, live, live_type, live_row_stride, live_layer_stride,
                                    replay, replay_type, replay_row_stride, replay_layer_stride,
                                    mask or None, rows, layers, k, stats, stream or None))
