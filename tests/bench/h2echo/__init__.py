"""The gRPC echo on HTTP/2 stacks of its own (tests/bench/h2_echo_server.py): what a Trireme-owned gRPC server would
cost per request, measured against grpc.aio and pygrpc-native (docs/benchmarks.md, issue 44 item 1)."""
