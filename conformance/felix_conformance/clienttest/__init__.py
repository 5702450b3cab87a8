"""The client tester: the kit plays a scripted broker, the client under test runs
a small adapter that performs what each case asks (Autobahn's fuzzing server is
the model).

    felix-conformance client --adapter "CMD" [--html report.html] [--json ...]

Modules:
  broker   - the scripted broker: reacts to what the client sends, checks the
             rules every client keeps (auth first, nothing ungated)
  adapter  - the adapter process, JSON lines per `schema/adapter.schema.json`
  cases    - the client cases: script, operations, judge
  runner   - one scripted broker and one adapter process per case, into a RunReport
"""
