"""Generated protobuf and gRPC stubs of the rollpack.v1 wire contract.

The *_pb2.py / *_pb2_grpc.py modules in this folder are generated at build
time (``make build``, or by hand from the repository root):

    protoc --proto_path=proto --python_out=client/python \
        --grpc_python_out=client/python \
        --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin \
        proto/rollpack/v1/*.proto

They are never committed.
"""
