"""Generated protobuf/gRPC code (protos/generate.py). Never edited by hand."""
