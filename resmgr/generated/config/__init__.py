"""Generated protobuf and gRPC modules of the config link and status API (protos/config/)."""
