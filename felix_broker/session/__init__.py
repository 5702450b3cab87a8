"""A client's session: the sans-IO stream protocol core, the QUIC adapter, the request
context shared by every service, and the dispatch table (docs/architecture.md)."""
