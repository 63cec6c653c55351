"""--grpc-transport=h2: Trireme's own HTTP/2 gRPC server (docs/grpc.md), a grpc.aio.Server look-alike serving the
same servicer handlers through a ServicerContext of its own."""
