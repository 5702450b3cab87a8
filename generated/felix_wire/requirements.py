# Generated from spec/requirements.yaml by codegen - DO NOT EDIT.
# requirements sha256: caa967219e037037bd91a1ca213ec7c78cd034425063a1c847c1282d1c593066
"""The protocol's requirements as a read-only table.

Code, tests and conformance transcripts cite a requirement by its id ("(T7)",
"(Q8, Q9)", a range "Q1-Q17" cites every id in it) and a section by its number
("§5.8"). `CITATION` and `SECTION_CITATION` find those citations in text; tools (the
conformance kit's coverage report, the tests) resolve them here.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Mapping, NamedTuple

__all__ = [
    "REQUIREMENTS_SHA256",
    "Requirement",
    "SECTIONS",
    "REQUIREMENTS",
    "CITATION",
    "SECTION_CITATION",
]

REQUIREMENTS_SHA256 = "caa967219e037037bd91a1ca213ec7c78cd034425063a1c847c1282d1c593066"


class Requirement(NamedTuple):
    id: str
    section: str
    text: str
    decision: str | None  # the spec/messages.yaml decision that settles an open item


SECTIONS: Mapping[str, str] = MappingProxyType(
    {
        "1": "Transport: QUIC streams and their roles",
        "2": "The frame envelope",
        "2.1": "Frame flag bits",
        "3": "Binary payload layouts",
        "3.1": "The publish batch body",
        "3.2": "Publish frames by flag value",
        "3.3": "The binary publish ack",
        "3.4": "Event batches",
        "3.5": "Worked binary frames",
        "4": "JSON encoding",
        "4.1": "Shared JSON value shapes",
        "5": "The message catalogue",
        "5.0": "Message index: direction, stream, answer, gate",
        "5.1": "Connection setup and generic answers",
        "5.2": "Publishing messages",
        "5.3": "Subscribing and delivery messages",
        "5.4": "Cache messages",
        "5.5": "Counter messages",
        "5.6": "Atomic commit and state messages",
        "5.7": "Time lookup and bounded read messages",
        "5.8": "Consumer group messages",
        "5.9": "Discovery, redirect and cluster messages",
        "5.10": "Operator inspection messages",
        "6": "Negotiation",
        "6.1": "Flag negotiation",
        "6.2": "Feature words",
        "6.3": "Feature bits",
        "7": "Ack modes, publish answers and pipelining",
        "8": "Error codes and retry classes",
        "9": "Broker semantics",
        "10": "Routing keys to shards",
        "11": "The broker's HTTP endpoints",
        "12": "Configuration knobs",
        "13": "Upstream wire vectors",
        "14": "What the sources leave open, and what we chose",
    }
)

REQUIREMENTS: Mapping[str, Requirement] = MappingProxyType(
    {
        "T1": Requirement(
            "T1",
            "1",
            "The protocol runs over IETF QUIC with TLS 1.3, and a client always verifies the broker's certificate.",
            None,
        ),
        "T2": Requirement(
            "T2",
            "1",
            "Client listeners speak ALPN felix/1; a client offering only other ids (such as the inter-broker felix-internal/1) fails the handshake.",
            None,
        ),
        "T3": Requirement(
            "T3",
            "1",
            "A client that offers no ALPN at all is still accepted unless the broker is configured to require ALPN.",
            None,
        ),
        "T4": Requirement(
            "T4",
            "1",
            "Requests and their answers travel on client-opened bidirectional streams, each answer on the stream of its request.",
            None,
        ),
        "T5": Requirement(
            "T5",
            "1",
            "Each client stream authenticates by itself with exactly one auth as its first frame; a request before it is unauthenticated and ends the stream, a second auth is invalid_request.",
            None,
        ),
        "T6": Requirement(
            "T6",
            "1",
            "Deliveries of a subscription or cache watch come on a broker-opened unidirectional stream whose first frame is event_stream_hello naming the subscription.",
            None,
        ),
        "T7": Requirement(
            "T7",
            "1",
            "A client may publish on its own unidirectional stream that starts with auth and carries only publishes; the broker answers nothing there and closes it on anything else.",
            None,
        ),
        "T8": Requirement(
            "T8",
            "1",
            "An unauthenticated stream may carry frames of at most preauth_max_frame_bytes (64 KiB) of payload, judged on the header alone, and only preauth_max_streams_per_conn (16) such streams per connection are read at once.",
            None,
        ),
        "T9": Requirement(
            "T9",
            "1",
            "A connection that authenticates no stream within auth_timeout_ms (10 s; 0 disables) is closed with application error 1, reason 'authentication timeout'.",
            None,
        ),
        "T10": Requirement(
            "T10",
            "1",
            "Connections beyond max_client_connections (8192) are refused during the handshake with CONNECTION_REFUSED.",
            None,
        ),
        "T11": Requirement(
            "T11",
            "1",
            "A broker closes client connections only with code 0 (shutting down) or 1 (authentication timeout).",
            None,
        ),
        "T12": Requirement(
            "T12",
            "1",
            "The QUIC listener defaults to 0.0.0.0:5000; a broker with several UDP ports lists them in auth_ok.listener_ports.",
            None,
        ),
        "T13": Requirement(
            "T13",
            "1",
            "The plain-HTTP metrics and health listener defaults to 0.0.0.0:8080, unauthenticated and read-only.",
            None,
        ),
        "T14": Requirement("T14", "1", "The QUIC idle timeout defaults to 6 s.", None),
        "T15": Requirement(
            "T15", "1", "A connection has at most 1024 concurrent streams in each direction.", None
        ),
        "T16": Requirement(
            "T16",
            "1",
            "An authenticated stream accepts frame payloads up to max_frame_bytes (16 MiB), and no encoder writes more than 2^32-1 payload bytes in one frame.",
            None,
        ),
        "T17": Requirement(
            "T17",
            "1",
            "Browsers reach brokers only through a separate WebSocket gateway, outside this protocol.",
            None,
        ),
        "T18": Requirement(
            "T18",
            "1",
            "Brokers talk to each other over a separate internal protocol, outside this one.",
            None,
        ),
        "F1": Requirement(
            "F1", "2", "A frame whose flags are 0 carries one UTF-8 JSON object: a message.", None
        ),
        "F2": Requirement(
            "F2",
            "2",
            "A receiver refuses a frame carrying a flag bit it does not know, or a flag set that describes no legal layout, and never masks bits away.",
            None,
        ),
        "F3": Requirement(
            "F3",
            "2",
            "On a control stream a broker answers a frame with an unknown flag bit with error invalid_request after consuming its length, and keeps reading the stream.",
            None,
        ),
        "F4": Requirement(
            "F4",
            "2",
            "A flags-0 payload that is not JSON, or a known type with missing or ill-typed fields, ends the control stream; an unknown type is not a decode failure.",
            None,
        ),
        "F5": Requirement(
            "F5",
            "2",
            "A sender sets only flag bits its peer advertised, so a broker refuses a broker-to-client layout arriving from a client.",
            None,
        ),
        "G1": Requirement(
            "G1",
            "4",
            "A JSON payload is an internally tagged object: its 'type' field names the message in snake_case and the other fields sit beside it.",
            None,
        ),
        "G2": Requirement(
            "G2",
            "4",
            "Encoders write compact JSON with 'type' first and the fields in catalogue order; decoders never depend on key order.",
            None,
        ),
        "G3": Requirement(
            "G3",
            "4",
            "Decoders ignore unknown fields, which is what keeps optional additions compatible.",
            None,
        ),
        "G4": Requirement(
            "G4",
            "4",
            "A field added after v1 is optional and defaults to the old behaviour, so peers that do not use it exchange identical bytes.",
            None,
        ),
        "G5": Requirement(
            "G5",
            "4",
            "An unknown 'type' decodes as an unknown request whose type and leniently read request_id can still be answered with unsupported.",
            None,
        ),
        "G6": Requirement(
            "G6",
            "4",
            "Byte fields are standard-alphabet base64 with padding; keys, group and consumer names and node ids are plain strings.",
            None,
        ),
        "G7": Requirement(
            "G7",
            "4",
            "Integers are JSON numbers, never strings, and u64 values keep all 64 bits.",
            None,
        ),
        "G8": Requirement(
            "G8",
            "4",
            "Absent optional fields are omitted, except cache_put.ttl_ms, cache_value.value and state_value.value, which are always written and may be null.",
            None,
        ),
        "G9": Requirement(
            "G9",
            "4",
            "Enum values are snake_case strings; data-carrying variants are objects keyed by the variant name.",
            None,
        ),
        "A1": Requirement(
            "A1", "7", "A JSON publish with no ack, or ack none, is never answered.", None
        ),
        "A2": Requirement(
            "A2",
            "7",
            "A JSON publish with ack per_message or per_batch and a request_id gets exactly one publish_ok or publish_error, one per request even for a batch.",
            None,
        ),
        "A3": Requirement(
            "A3",
            "7",
            "A binary publish without the acked modifier is never answered; an acked one (0x0008) is answered with a binary ack (0x0010); JSON publishers get JSON answers.",
            None,
        ),
        "A4": Requirement(
            "A4",
            "7",
            "Idempotent publishes, binary or JSON, are always answered in JSON: publish_ok, publish_error or publish_refused.",
            None,
        ),
        "A5": Requirement(
            "A5",
            "7",
            "By default a leader-mode publish is acknowledged when queued, without an offset; acknowledgement after the write, with an offset, comes with ack-on-commit, quorum streams, idempotent and forwarded batches, and the broker never invents an offset.",
            None,
        ),
        "A6": Requirement(
            "A6",
            "7",
            "The offset of an ack or publish_ok is the first record's; record i of the batch is at offset + i.",
            None,
        ),
        "A7": Requirement(
            "A7",
            "7",
            "A forwarded publish's binary ack may name the owner (0x0080) as a hint; JSON publish_ok never does.",
            None,
        ),
        "A8": Requirement(
            "A8",
            "7",
            "A malformed acked binary body is answered with an error correlated by the request_id read at payload offset 0.",
            None,
        ),
        "PL1": Requirement(
            "PL1",
            "7",
            "Pipelining is granted only to a client that offered FEATURE_PUBLISH_PIPELINE, through auth_ok.publish_window (default 256; 0 disables), and a window without the feature reads as none.",
            None,
        ),
        "PL2": Requirement(
            "PL2",
            "7",
            "With pipelining, answers to acked publishes come back in the order the stream carried them, without holding back other answers; without it, in completion order.",
            None,
        ),
        "PL3": Requirement(
            "PL3",
            "7",
            "At most publish_window acked publishes are unanswered per stream (per connection without FEATURE_STREAM_PUBLISH_WINDOW); at the limit the broker stops reading rather than refusing.",
            None,
        ),
        "PL4": Requirement(
            "PL4",
            "7",
            "A broker closes a stream whose oldest answer is overdue by twice its enqueue and ack waits instead of holding everything behind it.",
            None,
        ),
        "PL5": Requirement(
            "PL5",
            "7",
            "A broker admits at most 16 MiB of one connection's publish payload at a time; the rest waits in flow control.",
            None,
        ),
        "PL6": Requirement(
            "PL6",
            "7",
            "Reference clients use one publish stream per shard, at most 16 per broker, a 4 MiB in-flight budget and at most 64 idempotent batches in flight (client conventions, not wire rules).",
            None,
        ),
        "PL7": Requirement(
            "PL7",
            "7",
            "Without pipelining a reference broker still owes an answer to a JSON publish with a request_id and no ack field.",
            None,
        ),
        "N1": Requirement(
            "N1",
            "9",
            "An auth carrying client_flags is answered with auth_ok, one without with plain ok, and a failed auth with error unauthenticated.",
            None,
        ),
        "N2": Requirement(
            "N2",
            "9",
            "Until a stream's auth succeeds its peer has the original v1 flags and no features, and the pre-auth frame cap applies.",
            None,
        ),
        "N3": Requirement(
            "N3",
            "9",
            "A broker never sends a flag bit, message or field gated on something the client did not offer; direct answers to a request need no extra gate.",
            None,
        ),
        "N4": Requirement(
            "N4",
            "9",
            "A broker advertises only features it can answer (no durable storage, no groups or counters; an in-memory cache, no watches; standalone, no topology or redirects).",
            None,
        ),
        "N5": Requirement(
            "N5",
            "9",
            "server_features_hi goes only to clients that set FEATURE_EXTENDED, and a client _hi word without the marker is ignored.",
            None,
        ),
        "N6": Requirement(
            "N6",
            "9",
            "A client never sends a featured request to a broker that did not advertise the feature.",
            None,
        ),
        "N7": Requirement(
            "N7", "9", "A client's features are read from its auth and held per stream.", None
        ),
        "N8": Requirement(
            "N8",
            "9",
            "An unknown request type or any extension is answered with unsupported (type, extension, readable request_id) and the stream kept when both sides negotiated FEATURE_UNSUPPORTED; otherwise the stream is closed.",
            None,
        ),
        "N9": Requirement(
            "N9",
            "9",
            "A broker-to-client message type sent by a client is answered with error invalid_request and the stream closed; an error from a client closes it.",
            None,
        ),
        "N10": Requirement(
            "N10",
            "9",
            "A known type that fails to decode is fatal for the stream, while an unknown flag bit is a per-frame error.",
            None,
        ),
        "P1": Requirement(
            "P1",
            "9",
            "The publish key picks the shard (no key, shard 0), a batch has one key, and order holds per shard.",
            None,
        ),
        "P2": Requirement(
            "P2",
            "9",
            "A publish for a shard another broker owns is forwarded to the owner, authorized at both, and acknowledged once the owner wrote it.",
            None,
        ),
        "P3": Requirement(
            "P3",
            "9",
            "Publishes, cache and counter operations arriving while their shard moves are held up to 2 s or 1024 requests, then refused shard_unavailable moving with a retry hint.",
            None,
        ),
        "P4": Requirement(
            "P4",
            "9",
            "A publish is not_found only when its stream does not exist; a shard that cannot be served is shard_unavailable with a reason.",
            None,
        ),
        "P5": Requirement(
            "P5",
            "9",
            "A full tenant publish queue answers overloaded publish_queue_full with retry_after_ms and queues nothing; a tenant over quota answers overloaded tenant_quota.",
            None,
        ),
        "P6": Requirement(
            "P6",
            "9",
            "JSON publishes stay supported forever and are counted as compatibility traffic.",
            None,
        ),
        "I1": Requirement(
            "I1",
            "9",
            "producer_init is answered with producer_init_ok carrying a random 64-bit producer id chosen by the broker.",
            None,
        ),
        "I2": Requirement(
            "I2",
            "9",
            "Only the shard leader accepts idempotent batches; any other broker refuses with not_leader and never forwards them.",
            None,
        ),
        "I3": Requirement(
            "I3",
            "9",
            "Per producer and shard the leader keeps the next sequence and the last 64 batches, and answers duplicates, reuse, gaps, expired and unknown producers as its decision table says.",
            None,
        ),
        "I4": Requirement(
            "I4",
            "9",
            "A batch's digest is a CRC-64 of its payloads, and on durable streams the log keeps enough to answer resends identically after restarts and moves.",
            None,
        ),
        "I5": Requirement(
            "I5",
            "9",
            "A shard forgets a producer when retention removed all its batches or past 4096 producers, after which it is an unknown_producer.",
            None,
        ),
        "I6": Requirement(
            "I6",
            "9",
            "An idempotent client resends an unanswered batch under the same sequence, never reuses a sequence for another batch, and advances only on publish_ok.",
            None,
        ),
        "C1": Requirement(
            "C1",
            "9",
            "publish_if appends only when the batch would start exactly at expected_offset, otherwise publish_refused offset_mismatch naming the tail; it is never forwarded.",
            None,
        ),
        "C2": Requirement(
            "C2",
            "9",
            "commit with expected_offset checks the whole shard's tail the same way and writes nothing when refused.",
            None,
        ),
        "C3": Requirement(
            "C3",
            "9",
            "A conditional write whose answer was lost is not retried blindly; the writer reads at expected_offset instead.",
            None,
        ),
        "S1": Requirement(
            "S1",
            "9",
            "A subscribe without start begins at the latest record, earliest at the oldest retained one, and {offset: n} at exactly n.",
            None,
        ),
        "S2": Requirement(
            "S2",
            "9",
            "An offset that cannot be served is refused with subscribe_cursor_error too_old or in_future naming what is available, never silently restarted at the tail.",
            None,
        ),
        "S3": Requirement(
            "S3",
            "9",
            "A subscription reads one shard (default 0); a shard this broker does not serve is refused, by not_leader to redirect-capable clients.",
            None,
        ),
        "S4": Requirement(
            "S4",
            "9",
            "A subscribe is answered with subscribed on the control stream, then a unidirectional stream opens with event_stream_hello followed by deliveries.",
            None,
        ),
        "S5": Requirement(
            "S5",
            "9",
            "On durable streams, clients that negotiated offsets (0x0020) get start_offset and live_offset on subscribed, even for a plain subscribe.",
            None,
        ),
        "S6": Requirement(
            "S6",
            "9",
            "queue_capacity is clamped to 1..the broker maximum (4096) and echoed on subscribed only when it was asked for.",
            None,
        ),
        "S7": Requirement(
            "S7",
            "9",
            "Replay from disk joins live delivery with neither gap nor duplicate, and a subscription never ends by itself.",
            None,
        ),
        "S8": Requirement(
            "S8",
            "9",
            "Offsets within a batch are contiguous and skipped_before (0x0800) counts the non-event offsets just before it, so a reader can tell drops from skips.",
            None,
        ),
        "S9": Requirement(
            "S9", "9", "Generation-start records consume offsets but are never delivered.", None
        ),
        "S10": Requirement(
            "S10",
            "9",
            "A client that offered FEATURE_SUBSCRIPTION_LAGGED and offsets gets, at the first queue drop on a durable stream, what was queued then subscription_lagged with resume_from, and the stream ends; others see a gap.",
            None,
        ),
        "S11": Requirement(
            "S11",
            "9",
            "When a broker stops serving a shard it delivers what is queued, sends shard_moved with resume_from to clients that offered it, and ends the stream; the client resumes at max(last delivered + 1, resume_from).",
            None,
        ),
        "S12": Requirement(
            "S12",
            "9",
            "Batches with the publisher modifier (0x2000) carry the principal a write was accepted from, at most 255 bytes.",
            None,
        ),
        "S13": Requirement(
            "S13",
            "9",
            "Batches with the timestamps modifier (0x4000) carry the leader's clock at append in microseconds, one time per publish batch; in-memory streams have none.",
            None,
        ),
        "S14": Requirement(
            "S14",
            "9",
            "Subscriptions per connection are capped (4096 per identity) and the excess is refused with limit_exceeded.",
            None,
        ),
        "R1": Requirement(
            "R1",
            "9",
            "stream_read is answered by the shard leader alone with a page of committed records (at most 10000 records and 4 MiB, one oversized record alone), never waits, and refuses offsets outside the log with subscribe_cursor_error.",
            None,
        ),
        "R2": Requirement(
            "R2",
            "9",
            "offset_for_time answers the first offset appended at or after a time, nothing when no record is that recent, the oldest when all are later; leader only.",
            None,
        ),
        "K1": Requirement(
            "K1",
            "9",
            "cache_put stores a value with an optional TTL, cache_get answers cache_value (null when missing or expired), and cache_delete answers cache_value with the removed value or null.",
            None,
        ),
        "K2": Requirement(
            "K2",
            "9",
            "A cache key picks its shard by the publish hash, and brokers that do not own it forward cache and counter requests to the owner.",
            None,
        ),
        "K3": Requirement(
            "K3",
            "9",
            "A value's version is the log offset of the put that wrote it (a per-run microsecond counter without durable storage).",
            None,
        ),
        "K4": Requirement(
            "K4",
            "9",
            "cache_put_if and cache_delete_if check and write atomically on the key's owner, after any accepted write to the key is durable, and report the version written or found.",
            None,
        ),
        "K5": Requirement(
            "K5",
            "9",
            "Expired keys are deleted by the shard leader, once per second and at most 1024 per shard per pass, and watchers see the delete.",
            None,
        ),
        "K6": Requirement(
            "K6", "9", "Quorum cache reads confirm leadership first, by majority or by lease.", None
        ),
        "K7": Requirement(
            "K7",
            "9",
            "A cache watch names one key or one prefix (a key watch ignores shard), replays from from_offset then goes live, and on overflow delivers what it holds, sends cache_watch_lagged and ends.",
            None,
        ),
        "K8": Requirement(
            "K8",
            "9",
            "counter_add answers the sum including the delta and counter_get the current sum (absent if never written); counters live apart from cache values.",
            None,
        ),
        "M1": Requirement(
            "M1",
            "9",
            "commit appends an event and applies state changes on entity_key's shard as one record, answered commit_ok with the offset once durable; state_get answers the value and its version.",
            None,
        ),
        "Q1": Requirement(
            "Q1",
            "9",
            "Only the shard leader serves a group, others refuse and never answer an empty batch instead, and groups need durable storage.",
            None,
        ),
        "Q2": Requirement(
            "Q2",
            "9",
            "A group comes into being at offset 0 with its first poll, or through group_seek with if_new.",
            None,
        ),
        "Q3": Requirement(
            "Q3",
            "9",
            "A poll hands out at most 1000 records and about 4 MiB, long-polls up to min(wait_ms, the broker's maximum), and an empty group_records is a normal answer.",
            None,
        ),
        "Q4": Requirement(
            "Q4",
            "9",
            "A handed-out record is claimed for visibility_ms (0 means the broker default of 30 s, capped) and then owed again; attempts counts deliveries including the current one.",
            None,
        ),
        "Q5": Requirement(
            "Q5",
            "9",
            "A group has at most 10000 records in flight per shard, and a poll at that cap answers empty after its wait.",
            None,
        ),
        "Q6": Requirement(
            "Q6",
            "9",
            "A record delivered more than the maximum attempts (5) is dead-lettered: listed first, then finished.",
            None,
        ),
        "Q7": Requirement(
            "Q7",
            "9",
            "A group's cursor advances only over a contiguous run of acknowledged records.",
            None,
        ),
        "Q8": Requirement(
            "Q8",
            "9",
            "An ack or nack at or past the tail is invalid_request, below the group's position a harmless duplicate, on a record not yet handed out since a rebuild stale_claim, and otherwise takes the claim whoever holds it.",
            None,
        ),
        "Q9": Requirement(
            "Q9",
            "9",
            "In-flight state lives in leader memory, is rebuilt after a move or idle eviction, and then accepts settles below the tail it first saw.",
            None,
        ),
        "Q10": Requirement(
            "Q10",
            "9",
            "A nack redelivers now or after delay_ms; a nack naming attempts is refused stale_claim once that delivery's claim lapsed.",
            None,
        ),
        "Q11": Requirement(
            "Q11",
            "9",
            "group_extend with extend_ms 0 is invalid_request, grants a capped extension, and is refused stale_claim when the named delivery no longer holds its claim.",
            None,
        ),
        "Q12": Requirement(
            "Q12",
            "9",
            "group_dead_letter lists a record then finishes it; a finished record is invalid_request.",
            None,
        ),
        "Q13": Requirement(
            "Q13",
            "9",
            "Dead letters are offsets: group_redrive makes one owed again with attempts reset, without moving the cursor back, and group_discard drops it.",
            None,
        ),
        "Q14": Requirement(
            "Q14",
            "9",
            "group_seek moves to earliest, latest or an offset within them, if_new only moves a group with no cursor, and a seek voids standing claims but keeps dead letters.",
            None,
        ),
        "Q15": Requirement(
            "Q15",
            "9",
            "group_delete removes cursor, dead letters and in-flight state (answering whether it existed); group_describe answers group_info.",
            None,
        ),
        "Q16": Requirement(
            "Q16",
            "9",
            "A consumer member is a name of 1-128 bytes with its principal; a connection's first reclaiming poll takes over that member's claims held by older connections.",
            None,
        ),
        "Q17": Requirement(
            "Q17",
            "9",
            "Polling, settling and describing need group.consume (stream.subscribe also grants it); seek, delete, redrive and discard need group.manage (or stream.manage).",
            None,
        ),
        "D1": Requirement(
            "D1",
            "9",
            "topology_view lists brokers able to serve that advertised a client address, possibly none, and clients add it to their seeds.",
            None,
        ),
        "D2": Requirement(
            "D2",
            "9",
            "not_leader goes only to FEATURE_REDIRECT offerers, names the owner's client address and generation, and clients bound their redirect hops.",
            None,
        ),
        "D3": Requirement(
            "D3",
            "9",
            "stream_shards_view shards 0 means unknown, a standalone broker answers 1 shard, and shard_owners_view lists one entry per shard (no node_id on a standalone broker).",
            None,
        ),
        "D4": Requirement(
            "D4",
            "9",
            "Discovery answers come from the broker's routing snapshot, may be stale, and are scoped to the client's tenant.",
            None,
        ),
        "X1": Requirement(
            "X1",
            "9",
            "shard_inspect and subscriptions_list need the literal grant node.view:cluster:*, no wildcard, and are otherwise refused forbidden with the stream kept.",
            None,
        ),
        "V1": Requirement(
            "V1",
            "9",
            "A token verifies against the tenant's keys with iss felix-auth, aud felix-broker, valid exp and nbf, and a tid equal to auth.tenant_id; its perms are matched per operation.",
            None,
        ),
        "L1": Requirement(
            "L1",
            "3.1",
            "Every binary publish frame carries the same body: tenant, namespace and stream as short strings, then a counted list of length-prefixed payloads.",
            None,
        ),
        "L2": Requirement(
            "L2",
            "3.2",
            "The flag value of a publish frame says which optional heads (request id and ack mode, producer and sequence, key) precede the body.",
            None,
        ),
        "L3": Requirement(
            "L3",
            "3.3",
            "A binary publish ack carries status and request id, and its modifiers add owner, offset, error code and retry class, and detail, each only when the client offered it.",
            None,
        ),
        "L4": Requirement(
            "L4",
            "3.4",
            "Event batches come shared (0x0004, encoded once) or legacy (0x0002, naming the subscription), with base offset, skipped count, publisher and timestamps added by modifiers.",
            None,
        ),
        "L5": Requirement(
            "L5",
            "2",
            "A frame is a 12-byte big-endian header (magic FLX1, version 1, flags, payload length) followed by exactly length payload bytes; a frame cut short by the end of its stream is never acted on.",
            None,
        ),
        "J1": Requirement(
            "J1",
            "5.1",
            "error and unsupported are the generic answers: error carries message (and code, retry, detail for FEATURE_ERROR_CODES clients), unsupported names the request type, extension and request_id.",
            None,
        ),
        "J2": Requirement(
            "J2", "5.2", "A JSON publish's ack is none, per_message or per_batch.", None
        ),
        "NG1": Requirement(
            "NG1",
            "6.1",
            "Each side states the frame flags it can read, and a broker tracks its peer's flags per stream, starting from the original v1 set.",
            None,
        ),
        "NG2": Requirement(
            "NG2",
            "6.2",
            "Feature bits say which requests exist, separately from flag bits; FEATURE_EXTENDED marks a second word whose bit 0 is feature 32.",
            None,
        ),
        "E1": Requirement(
            "E1",
            "8",
            "A refusal carries an error code and a retry class (retry, retry_after, redirect, outcome_unknown, fatal) to clients that offered FEATURE_ERROR_CODES, the auth offer being read before auth is judged.",
            None,
        ),
        "E2": Requirement(
            "E2", "8", "Token failures are unauthenticated with retry class fatal.", None
        ),
        "RT1": Requirement(
            "RT1",
            "10",
            "A routing key's bytes are hashed with 64-bit FNV-1a and a finalizer, and the stream's mode (modulo by default, or jump hash) maps the hash to a shard.",
            None,
        ),
        "RT2": Requirement(
            "RT2",
            "10",
            "No key, or a shard count of at most 1, means shard 0; an empty key is a key.",
            None,
        ),
        "H1": Requirement(
            "H1",
            "11",
            "The broker's HTTP listener serves /live, /ready (503 while draining), /metrics, /replication/halted and /backup/offsets without authentication, and changes nothing.",
            None,
        ),
        "H2": Requirement(
            "H2",
            "11",
            "The /backup/offsets answer lists, for each shard the broker leads, the committed offset of each of its logs, and the shards it skipped with the reason.",
            None,
        ),
        "CF1": Requirement(
            "CF1",
            "12",
            "Every broker knob has a documented default, and the protocol's FELIX_* variable where it names one.",
            None,
        ),
        "W1": Requirement(
            "W1",
            "13",
            "A conforming codec decodes each upstream wire vector to its stated fields and re-encodes it to the identical bytes.",
            None,
        ),
        "U1": Requirement(
            "U1",
            "14",
            "The CRC-64 variant and the exact bytes fed to the idempotent-producer digest are unspecified.",
            None,
        ),
        "U2": Requirement(
            "U2",
            "14",
            "publish_width's fields, answer and feature bit are unspecified.",
            "publish-width",
        ),
        "U3": Requirement(
            "U3", "14", "stream_deleted's fields and feature bit are unspecified.", "stream-deleted"
        ),
        "U4": Requirement(
            "U4",
            "14",
            "The meaning of a client-supplied subscription_id on subscribe and cache_watch is unspecified.",
            "subscription-id-on-requests",
        ),
        "U5": Requirement(
            "U5",
            "14",
            "Whether brokers also advertise FEATURE_SUBSCRIPTION_LAGGED is unspecified; this broker does not.",
            None,
        ),
        "U6": Requirement(
            "U6",
            "14",
            "What distinguishes binary ack_mode 1 (per_message) from 2 (per_batch) on a single frame is unspecified.",
            None,
        ),
        "U7": Requirement(
            "U7",
            "14",
            "Frames combining two layout bits, or a broker-to-client layout arriving at a broker, are not described.",
            "layout-bit-combinations",
        ),
        "U8": Requirement(
            "U8",
            "14",
            "Whether acked publishes are refused on a publish-only unidirectional stream, where no answer can travel, is unspecified.",
            None,
        ),
        "U9": Requirement(
            "U9", "14", "Whether a stream stays open after a failed auth is unspecified.", None
        ),
        "U10": Requirement(
            "U10",
            "14",
            "The integer widths of group_info's in_flight, owed and dead_letters are unspecified.",
            "group-info-widths",
        ),
        "U11": Requirement(
            "U11",
            "14",
            "No rule says which event encoding (shared, legacy or JSON) a broker picks.",
            None,
        ),
        "U12": Requirement(
            "U12",
            "14",
            "The cache's routing mode, and that a cache key hashes as its UTF-8 bytes, are unspecified (spec/messages.yaml routing.cache_mode records the choice).",
            None,
        ),
        "U13": Requirement("U13", "14", "The shape of /replication/halted is unspecified.", None),
        "U14": Requirement(
            "U14",
            "14",
            "Some defaults and names (the publish quorum timeout, the tenant publish variables, the region bridges format) are unspecified.",
            None,
        ),
        "U15": Requirement(
            "U15",
            "14",
            "The permission names for publishing and cache operations are unspecified.",
            None,
        ),
        "U16": Requirement(
            "U16",
            "14",
            "How an absent cache_put_if.ttl_ms is encoded, and the key order of messages no vector pins, are unspecified.",
            "cache-put-if-ttl",
        ),
        "U17": Requirement(
            "U17",
            "14",
            "The answer to group_discard and group_redrive is not pinned by the protocol document.",
            "group-discard-redrive-answer",
        ),
        "U18": Requirement(
            "U18",
            "14",
            "Whether encoders emit group_poll.wait_ms when it is 0 is unspecified.",
            "group-poll-wait-ms",
        ),
    }
)

# A requirement id in prose: one of the prefixes the table uses, then a number.
CITATION = re.compile(r"\b(?:CF|NG|PL|RT|A|C|D|E|F|G|H|I|J|K|L|M|N|P|Q|R|S|T|U|V|W|X)[1-9][0-9]?\b")
# A section number in prose, after a section sign.
SECTION_CITATION = re.compile(r"§((?:1[0-9]|[1-9])(?:\.(?:1[0-9]|[0-9]))?)")
