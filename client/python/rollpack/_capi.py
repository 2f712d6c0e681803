"""The binding of librollpack_trainer.so's C ABI (client/trainer/trainer_capi.h),
shared by rollpack.trainer and rollpack.replay.

ctypes, not a compiled extension: nothing here is built against one Python
or torch version, so the same package works from a pip install on any
CPython, and only the C library is built per machine. Handles and pointers
are Python ints; arrays leave as DLPack "dltensor" capsules. ctypes releases
the GIL during every call, so a blocking open or next does not hold up other
Python threads.

The library is $ROLLPACK_TRAINER_LIBRARY, else librollpack_trainer.so next to
this file. A failed call raises RuntimeError(code, message); ``call`` turns
that into the rollpack.errors class of the code (with ``resume_from``, the
micro-batch a failed stream resumes from, when the error names one).
"""

import ctypes
import os

import grpc

from rollpack import errors

ABI_VERSION = 3

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


class StreamOptions(ctypes.Structure):
    """rpt_stream_options (trainer_capi.h); struct_size versions it."""
    _fields_ = [("struct_size", _c.c_uint32)] + [
        (n, _c.c_int32) for n in ("dp", "cp", "tp", "pp", "device", "prefetch", "all_fields",
                                  "start_index", "ids_int32", "masked_fill_minus_one",
                                  "tp_leader_size", "rendezvous_timeout_s")
    ] + [("rendezvous_tag", _c.c_char_p), ("resume_timeout_ms", _c.c_int32),
         ("max_resumes", _c.c_int32), ("delivery", _c.c_int32),
         ("skip_replay_ids", _c.c_int32), ("connect_grace_ms", _c.c_int32)]

# rpt_stream_options.delivery (RPT_DELIVERY_*).
DELIVERY = {"auto": 0, "direct": 1, "proxy": 2}


_SIGS = {
    "rpt_abi_version": (_I, []),
    "rpt_last_error": (_c.c_char_p, []),
    "rpt_last_resume_from": (_L, []),
    "rpt_has_cuda": (_I, []),
    "rpt_close_tp_communicators": (None, []),
    "rpt_stream_open": (_I, [_c.c_char_p, _c.POINTER(ConnectOptions), _c.c_char_p,
                             _c.POINTER(StreamOptions), _c.POINTER(_P)]),
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
    "rpt_batch_has_array": (_I, [_P, _c.c_char_p]),
    "rpt_batch_num_group_ids": (_I, [_P]),
    "rpt_batch_group_id": (_c.c_char_p, [_P, _I]),
    "rpt_batch_policy_versions": (_c.POINTER(_L), [_P]),
    "rpt_batch_num_scalars": (_I, [_P]),
    "rpt_batch_scalar_name": (_c.c_char_p, [_P, _I]),
    "rpt_batch_num_ragged_fields": (_I, [_P]),
    "rpt_batch_ragged_field_name": (_c.c_char_p, [_P, _I]),
    "rpt_dlpack_free": (None, [_P]),
    "rpt_unpack": (_I, [_I, _P, _I, _P, _L, _L, _I, _P, _I, _I, _P]),
    "rpt_apply_forward": (_I, [_I, _P, _I, _P, _I, _L, _L, _I, _I, _I, _I, _F, _P, _P, _P, _P]),
    "rpt_apply_backward": (_I, [_I, _P, _I, _P, _I, _L, _L, _I, _I, _I, _I, _F, _P, _P, _P]),
    "rpt_agreement_logits": (_I, [_I, _P, _I, _L, _P, _I, _L, _L, _P, _L, _L, _I, _I, _P, _P]),
    "rpt_agreement_ids": (_I, [_I, _P, _I, _L, _L, _P, _I, _L, _L, _P, _L, _L, _I, _P, _P]),
    "rpt_unpack_static": (_I, [_I, _P, _I, _P, _L, _P, _L, _I, _I, _P, _I, _L, _L, _L, _I, _P]),
    "rpt_store_rows": (_I, [_I, _P, _L, _P]),
    "rpt_stage_static": (_I, [_I, _P, _I, _P, _L, _L, _I, _I, _P, _I, _P, _P, _L, _P]),
}


# Added to ABI 3 after its first release: a library built before them still
# works, without what they give (here: RollpackError.resume_from is None;
# micro-batches without group_ids, policy_versions, scalars, advantages).
_SEQUENCE_INFO = ("rpt_batch_has_array", "rpt_batch_num_group_ids", "rpt_batch_group_id",
                  "rpt_batch_policy_versions", "rpt_batch_num_scalars", "rpt_batch_scalar_name")
# Also added later: the ragged token fields (layout.md section 13); an older
# library's micro-batches have none.
_RAGGED = ("rpt_batch_num_ragged_fields", "rpt_batch_ragged_field_name")
_OPTIONAL = {"rpt_last_resume_from", "rpt_unpack_static", "rpt_store_rows",
             "rpt_stage_static"} | set(_SEQUENCE_INFO) | set(_RAGGED)


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
                if name in _OPTIONAL:
                    continue
                raise ImportError("rollpack: %s has no %s: it is older than this package; "
                                  "rebuild the target rollpack_trainer" % (path, name)) from None
            fn.restype = res
            fn.argtypes = args
        if lib.rpt_abi_version() != ABI_VERSION:
            raise ImportError("rollpack: %s has C ABI %d, this package needs %d: rebuild the "
                              "target rollpack_trainer" % (path, lib.rpt_abi_version(),
                                                           ABI_VERSION))
        _LIB = lib
    return _LIB


def _check(rc):
    if rc != 0:
        lib = _lib()
        # Per thread: this failed call's (-1: none, or a library without it).
        resume_from = lib.rpt_last_resume_from() if hasattr(lib, "rpt_last_resume_from") else -1
        raise RuntimeError(rc, lib.rpt_last_error().decode(errors="replace"),
                           resume_from if resume_from >= 0 else None)


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def call(fn, what, *args):
    """fn(*args), a function of this module; its failure raised as the
    rollpack.errors class of the status code, with ``what`` in front."""
    try:
        return fn(*args)
    except RuntimeError as e:
        if len(e.args) in (2, 3) and isinstance(e.args[0], int):
            code = _CODES.get(e.args[0], grpc.StatusCode.UNKNOWN)
            cls = errors._BY_CODE.get(code, errors.RollpackError)
            resume_from = e.args[2] if len(e.args) == 3 else None
            raise cls("%s: %s" % (what, e.args[1]), code=code, details=e.args[1],
                      resume_from=resume_from) from None
        raise


_pythonapi = ctypes.pythonapi
_pythonapi.PyCapsule_New.restype = ctypes.py_object
_pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_pythonapi.PyCapsule_IsValid.restype = ctypes.c_int
_pythonapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
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


def stream_options(dp, cp, tp, pp, device, prefetch=2, all_fields=False, start_index=0,
                   ids_int32=False, fill=False, tp_leader_size=0, rendezvous_timeout_s=300,
                   rendezvous_tag="", resume_timeout_ms=0, max_resumes=0, delivery=0,
                   replay_ids=True, connect_grace_ms=0):
    """A StreamOptions (its tag bytes are kept alive by the structure).
    resume_timeout_ms: 0 = the library's default (60 s), < 0 = no limit;
    connect_grace_ms: 0 = the library's default (10 s), < 0 = no grace;
    max_resumes: 0 = no cap, < 0 = never resume; delivery: a DELIVERY value
    (trainer_capi.h)."""
    o = StreamOptions()
    o.struct_size = ctypes.sizeof(StreamOptions)
    o.dp, o.cp, o.tp, o.pp, o.device = dp, cp, tp, pp, device
    o.prefetch, o.all_fields, o.start_index = prefetch, int(all_fields), start_index
    o.ids_int32, o.masked_fill_minus_one = int(ids_int32), int(fill)
    o.tp_leader_size, o.rendezvous_timeout_s = tp_leader_size, rendezvous_timeout_s
    o.rendezvous_tag = _bytes(rendezvous_tag)
    o.resume_timeout_ms, o.max_resumes = resume_timeout_ms, max_resumes
    o.delivery = delivery
    o.skip_replay_ids = 0 if replay_ids else 1
    o.connect_grace_ms = connect_grace_ms
    return o


def open(address, step_id, options, connect=None):  # noqa: A001
    """A stream handle; options: a StreamOptions (``stream_options``)."""
    out = _P()
    c = _connect(connect)
    _check(_lib().rpt_stream_open(address.encode(), ctypes.byref(c), step_id.encode(),
                                  ctypes.byref(options), ctypes.byref(out)))
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


def has_sequence_info():
    """Whether the library hands out the per-sequence metadata (group ids,
    policy versions, scalars, advantages; lifecycle.md section 6)."""
    lib = _lib()
    return all(hasattr(lib, n) for n in _SEQUENCE_INFO)


def batch_has_array(b, name):
    return bool(_lib().rpt_batch_has_array(b, name.encode()))


def batch_group_ids(b):
    """The group id of every sequence ("" = ungrouped), or None when the
    micro-batch came without them (a rollpackd older than them)."""
    lib = _lib()
    n = lib.rpt_batch_num_group_ids(b)
    if n == 0 and lib.rpt_batch_num_samples(b) > 0:
        return None
    return [lib.rpt_batch_group_id(b, i).decode() for i in range(n)]


def batch_policy_versions(b):
    """The policy version of every sequence as a list of ints (None as for
    batch_group_ids)."""
    lib = _lib()
    n = lib.rpt_batch_num_group_ids(b)
    if n == 0:
        return None if lib.rpt_batch_num_samples(b) > 0 else []
    p = lib.rpt_batch_policy_versions(b)
    return [int(p[i]) for i in range(n)]


def batch_scalar_names(b):
    lib = _lib()
    return [lib.rpt_batch_scalar_name(b, i).decode() for i in range(lib.rpt_batch_num_scalars(b))]


def batch_ragged_fields(b):
    """The names of the batch's ragged token fields, in name order ([] from
    a library older than them)."""
    lib = _lib()
    if not all(hasattr(lib, n) for n in _RAGGED):
        return []
    return [lib.rpt_batch_ragged_field_name(b, i).decode()
            for i in range(lib.rpt_batch_num_ragged_fields(b))]


def batch_tensor(b, name, from_dlpack):
    """from_dlpack(capsule) of the batch's array ``name``. The capsule has no
    destructor (a ctypes callback could run inside the garbage collector), so
    a DLManagedTensor that from_dlpack did not take over is freed here."""
    lib = _lib()
    t = lib.rpt_batch_dlpack(b, name.encode())
    if not t:
        _check(3)
    capsule = _pythonapi.PyCapsule_New(t, _DLTENSOR, None)
    try:
        return from_dlpack(capsule)
    except BaseException:
        # A consumer renames the capsule "used_dltensor" once it owns it.
        if _pythonapi.PyCapsule_IsValid(capsule, _DLTENSOR):
            lib.rpt_dlpack_free(t)
        raise


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


def has_static_targets():
    """Whether the library has the static replay buffer entry points
    (rollpack.static_targets); a library built before them has not."""
    lib = _lib()
    return all(hasattr(lib, n) for n in ("rpt_unpack_static", "rpt_store_rows",
                                          "rpt_stage_static"))


def unpack_static(device, experts, in_type, mask, rows, rows_ptr, layers, k, num_experts, out,
                  out_type, max_rows, out_row_stride, out_layer_stride, fill, stream):
    """rpt_unpack_static (trainer_capi.h); rows_ptr 0 = use ``rows``."""
    _check(_lib().rpt_unpack_static(device, experts, in_type, mask or None, rows,
                                    rows_ptr or None, layers, k, num_experts, out, out_type,
                                    max_rows, out_row_stride, out_layer_stride, int(fill),
                                    stream or None))


def store_rows(device, rows_ptr, rows, stream):
    """rpt_store_rows: *rows_ptr = rows, ordered on ``stream``."""
    _check(_lib().rpt_store_rows(device, rows_ptr, rows, stream or None))


def stage_static(device, experts, in_type, mask, rows, layers, k, index, staging_experts,
                 staging_type, staging_mask, staging_rows, max_rows, stream):
    """rpt_stage_static: a micro-batch's ids and mask into the staging, its
    row count into *staging_rows, ordered on ``stream``."""
    _check(_lib().rpt_stage_static(device, experts, in_type, mask or None, rows, layers, k,
                                   index, staging_experts, staging_type, staging_mask,
                                   staging_rows, max_rows, stream or None))
