"""A real peer-to-peer federation: one process per center over gRPC with mutual TLS, driving the same
methods as the simulator (docs/p2p.md)."""
