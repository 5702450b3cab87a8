"""Chaos testing support: the recorded history of client operations and its checker.

`history` is the format a workload writes (JSON lines, one operation a line);
`checker` judges a history against the rules a replicated broker must keep. Both
are plain modules with no broker state, so `make chaos`, the tests and a person
with a history file on disk use the same code.
"""
