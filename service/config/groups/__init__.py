"""Flag groups of `trireme serve` beyond the core ones (flags.py): each module adds one group of Triton flags and
turns the parsed values into settings (endpoints in the cloud, gRPC options and transport, logging, the rate
limiter, model loading)."""
