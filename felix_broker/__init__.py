"""The Felix broker: configuration, catalog, tokens, permissions, TLS and HTTP listener.

The protocol core (frames, sessions, publish/subscribe) lives beside these
infrastructure modules; each module here owns one concern and can be imported
on its own.
"""
