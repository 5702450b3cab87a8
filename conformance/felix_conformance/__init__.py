"""felix_conformance: a protocol conformance kit for Felix brokers (and clients).

Cases are YAML transcripts (validated by `schema/transcript.schema.json`) tied to
the catalogue of the generated wire layer `felix_wire`. The runner plays a
transcript's client side against any broker over `felix_transport` and compares
decoded fields; the recorder turns real sessions into transcripts; the playback
server plays the broker's side to test clients.

Modules (one concern each):
  schema    - the transcript JSON Schema and its validation
  model     - the typed case model parsed from a validated transcript
  corpus    - finding, loading and filtering transcripts
  matching  - variables, captures and field matchers
  frames    - frames to send, frames received, both through felix_wire
  wirelog   - the per-case wire log
  target    - where the target is, how to reach it, what it advertises
  session   - connections and streams of one case at run time
  runner    - playing a case's steps and reaching a verdict
  verdicts  - verdicts and results
  reports   - terminal summary, JSON and JUnit reports
  coverage  - which catalogue entries the corpus exercises
  recorder  - the QUIC man-in-the-middle that records transcripts
  playback  - the broker side of transcripts, for client testing
  cli       - `felix-conformance`
"""

__version__ = "0.1.0"
