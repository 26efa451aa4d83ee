"""Generated protobuf and gRPC modules of the node agent API (protos/agent/api.proto)."""
