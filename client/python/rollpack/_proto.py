"""Imports the generated stubs, with a clear message when they are missing."""

try:
    from rollpack.v1 import ndarray_pb2, rollouts_pb2, rollouts_pb2_grpc  # noqa: F401
    from rollpack.v1 import scheduler_pb2, scheduler_pb2_grpc  # noqa: F401
    from rollpack.v1 import trainer_pb2, trainer_pb2_grpc  # noqa: F401
    from rollpack.v1 import cluster_admin_pb2, cluster_admin_pb2_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "rollpack: the generated protobuf stubs (rollpack/v1/*_pb2.py) are missing. "
        "Run `make build` from the repository root, or: protoc --proto_path=proto "
        "--python_out=client/python --grpc_python_out=client/python "
        "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin "
        "proto/rollpack/v1/*.proto  (" + str(e) + ")"
    ) from e
