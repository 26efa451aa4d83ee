"""Generated CRI v1 (runtime.v1) protobuf and gRPC modules; see scripts/genproto.py."""
