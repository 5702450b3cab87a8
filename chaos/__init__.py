"""The real-fleet chaos runner (our Jepsen): workload, nemesis and checker.

A top-level package, not part of the broker or the client: it drives real broker
processes (``felix_broker``) with real clients (``felix_client``), which the
layering keeps apart. `run.run` is one run; ``python -m chaos`` and ``make chaos``
call it; the rules it judges by are `felix_broker.chaos.checker`'s.
"""
