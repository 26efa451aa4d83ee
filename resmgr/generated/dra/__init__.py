"""Generated protobuf and gRPC modules of kubelet's DRA node service (protos/dra/api.proto)."""
