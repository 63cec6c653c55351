"""Generated protobuf and gRPC code for the inference protocol (see *.proto; regenerate with tools/gen_protos.py)."""
