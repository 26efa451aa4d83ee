"""Generated protobuf and gRPC modules of kubelet's plugin registration (protos/pluginregistration/api.proto)."""
