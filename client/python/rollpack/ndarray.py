"""numpy <-> rollpack.v1.NDArray (dense, C order, little-endian)."""

import numpy as np

from rollpack._proto import ndarray_pb2

_D = ndarray_pb2
# wire dtype -> numpy dtype (BFLOAT16 is carried as its raw uint16 bits)
_TO_NUMPY = {
    _D.UINT8: np.dtype("u1"), _D.UINT16: np.dtype("<u2"), _D.INT16: np.dtype("<i2"),
    _D.INT32: np.dtype("<i4"), _D.INT64: np.dtype("<i8"), _D.FLOAT32: np.dtype("<f4"),
    _D.FLOAT16: np.dtype("<f2"), _D.BFLOAT16: np.dtype("<u2"),
    # Sent only (a pool declaring the field float32 with allow_narrowing
    # rounds it); the server never stores or returns it.
    _D.FLOAT64: np.dtype("<f8"),
}
_FROM_KIND = {
    ("u", 1): _D.UINT8, ("u", 2): _D.UINT16, ("i", 2): _D.INT16, ("i", 4): _D.INT32,
    ("i", 8): _D.INT64, ("f", 4): _D.FLOAT32, ("f", 2): _D.FLOAT16, ("f", 8): _D.FLOAT64,
}


def wire_dtype(dtype):
    """The DType enum value for a numpy dtype or its name (ValueError when
    unsupported)."""
    if isinstance(dtype, str) and dtype.lower() == "bfloat16":
        return _D.BFLOAT16
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":  # ml_dtypes / torch-exported bfloat16
        return _D.BFLOAT16
    if dtype == np.bool_:
        return _D.UINT8
    code = _FROM_KIND.get((dtype.kind, dtype.itemsize))
    if code is None:
        raise ValueError("dtype %s has no rollpack wire type (supported: uint8, uint16, "
                         "int16, int32, int64, float16, float32, bfloat16; float64 into a float32 field "
                         "declared with allow_narrowing)" % dtype)
    return code


def numpy_dtype(code):
    try:
        return _TO_NUMPY[code]
    except KeyError:
        raise ValueError("NDArray dtype %s is not supported"
                         % ndarray_pb2.DType.Name(code) if code in ndarray_pb2.DType.values()
                         else "NDArray dtype %d is unknown" % code) from None


def fill(pb, arr):
    """Writes ``arr`` into the NDArray message ``pb`` (one copy: the bytes)."""
    arr = np.asarray(arr)
    code = wire_dtype(arr.dtype)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not _LITTLE):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    pb.dtype = code
    pb.shape[:] = arr.shape
    # protobuf wants a bytes object: tobytes() is the one unavoidable copy
    # (it also makes a non-contiguous view contiguous on the way).
    pb.data = arr.tobytes()
    return pb


def to_proto(arr):
    return fill(ndarray_pb2.NDArray(), arr)


def from_proto(pb):
    """A read-only view of the message's bytes (np.frombuffer, no copy)."""
    dtype = numpy_dtype(pb.dtype)
    shape = tuple(pb.shape)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(pb.data) != count * dtype.itemsize:
        raise ValueError("NDArray of shape %s and dtype %s must hold %d bytes, holds %d"
                         % (list(shape), ndarray_pb2.DType.Name(pb.dtype),
                            count * dtype.itemsize, len(pb.data)))
    return np.frombuffer(pb.data, dtype=dtype, count=count).reshape(shape)


_LITTLE = np.little_endian
