"""Talking to the server: the synchronous gRPC client, the minimal HTTP/2 client and the asynchronous transports."""
