"""rasd.api.v1: generated protobuf and gRPC modules. Never edit; run proto/generate.py."""
