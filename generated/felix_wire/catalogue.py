# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Read-only index of the catalogue: every name the generated layer knows.

Tests count these against tests/vectors/protocol-tables.yaml; tools (the conformance
kit, docs) read them to learn what exists without parsing the YAML.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, NamedTuple

from .binary import BINARY_CLASSES
from .errors import ERROR_CLASSES, ErrorCode
from .features import FEATURE_INFO
from .flags import FLAG_INFO, LAYOUT_BY_FLAG
from .messages import MESSAGE_CLASSES

__all__ = [
    "SPEC_SHA256",
    "Decision",
    "DECISIONS",
    "MESSAGES",
    "BINARY_LAYOUTS",
    "LEGAL_FLAG_VALUES",
    "ERROR_CODES",
    "FLAGS",
    "FEATURES",
    "COUNTS",
]

SPEC_SHA256 = "1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c"


class Decision(NamedTuple):
    topic: str
    choice: str
    why: str


DECISIONS: Mapping[str, Decision] = MappingProxyType(
    {
        "cache-put-answer": Decision(
            "answer to cache_put",
            "cache_ok with request_id; a cache_put without request_id is answered with cache_ok carrying request_id 0",
            "the seed and the official client expect cache_ok with request_id; plain ok makes the official client reconnect, and cache_ok without request_id fails its decoder",
        ),
        "acked-json-publish-answer": Decision(
            "answer to an acked JSON publish",
            "publish_ok / publish_error",
            "the protocol's message section and the seed; the 'ok' of a legacy flow diagram is not followed",
        ),
        "cache-get-request-id-type": Decision(
            "cache_get request_id type", "u64", "every source but one seed example uses a number"
        ),
        "publish-error-detail-null": Decision(
            "publish_error.detail",
            "omitted when absent; null accepted on decode",
            "the reference codec omits absent fields",
        ),
        "subscribed-offsets": Decision(
            "start_offset/live_offset on a plain subscribe",
            "sent to clients that negotiated 0x0020 on durable streams even without start",
            "the protocol document is authoritative over the seed",
        ),
        "ack-default": Decision(
            "default of publish.ack when absent",
            "none (no answer) unless the client negotiated FEATURE_PUBLISH_PIPELINE and sent a request_id, in which case an answer is owed",
            "the seed says none; the reference broker's pipelining path answers a JSON publish carrying a request_id",
        ),
        "unknown-type-without-unsupported": Decision(
            "unknown request type without FEATURE_UNSUPPORTED",
            "close the stream (not the connection)",
            "the protocol's newer statement",
        ),
        "group-poll-wait-ms": Decision(
            "group_poll.wait_ms = 0 on encode",
            "emitted",
            "older reference codecs emit it; a decoder treats missing as 0 either way",
        ),
        "cache-put-if-ttl": Decision(
            "absent cache_put_if.ttl_ms on encode",
            "omitted; null accepted on decode",
            "the protocol's presence rule for optional fields",
        ),
        "group-discard-redrive-answer": Decision(
            "answer to group_discard / group_redrive", "cache_ok", "the reference client expects it"
        ),
        "group-info-widths": Decision(
            "width of group_info in_flight / owed / dead_letters",
            "u64",
            "u64 is safe for any count",
        ),
        "subscription-id-on-requests": Decision(
            "client-supplied subscription_id on subscribe / cache_watch",
            "accepted and ignored; the broker assigns the id it reports",
            "its meaning is unspecified",
        ),
        "publish-width": Decision(
            "publish_width fields and gate",
            "tenant_id, namespace, stream, shards (u32); no request_id; no answer; gated by FEATURE_PUBLISH_WIDTH = extended bit 0x4",
            "observed from the official client 0.6.2, which sends it only when the broker sets EXTENDED and hi bit 0x4",
        ),
        "stream-deleted": Decision(
            "stream_deleted fields and gate",
            "subscription_id (u64, required) by analogy with the other last frames; FEATURE_STREAM_DELETED has no known bit value and is never advertised or offered",
            "seed only; no source gives fields or a bit",
        ),
        "hex-trailing-newline": Decision(
            "upstream .hex files ending with a newline",
            "strip white space before comparing",
            "the newline is not part of the data",
        ),
        "layout-bit-combinations": Decision(
            "frames combining two layout bits",
            "rejected as an illegal flag combination",
            "not described anywhere; a layout must be unambiguous",
        ),
        "base64-trailing-bits": Decision(
            "base64 with non-zero trailing bits (e.g. aGVsbG9= for hello)",
            "accepted on decode; unpadded input, a wrong alphabet or wrong padding is refused; encoders always write canonical base64",
            "the reference decoder is strict; msgspec's decoder accepts these bits, and refusing them would cost a second pass over every byte field for no interoperability gain since every encoder writes canonical base64",
        ),
        "sequence-reused-unoffered": Decision(
            "a remembered sequence with other payloads, from a client that did not offer FEATURE_SEQUENCE_REUSED",
            "publish_ok with the original batch's offset; nothing is written",
            "the later-dated upstream answer table (cluster facts A.14); the protocol facts only restrict sequence_reused to offerers",
        ),
        "state-read-not-ready": Decision(
            "state_get before the state view is rebuilt",
            "a standalone broker rebuilds a shard's state view from its log before the shard serves anything, so no read is ever not ready; a shard whose log failed answers error storage with retry class retry",
            "cluster facts A.16 describe the refusal for a view rebuilt after a promotion or catch-up, which a standalone broker never has",
        ),
        "subscriptions-list-dropping": Decision(
            "subscriptions_list filter dropping",
            "true keeps the subscribers that have dropped records (dropped > 0)",
            "the facts name the filter without its meaning",
        ),
        "pending-feature-words": Decision(
            "extended bits 0x2 and 0x8 offered by the official client",
            "catalogued as unnamed bits that we neither advertise nor gate anything on",
            "observed, meaning unknown",
        ),
        "quorum-ack-model": Decision(
            "what releases a Quorum acknowledgement (upstream's documents disagree whether follower acks are built, cluster facts D.3)",
            "majority_ack from the start: a write is acknowledged once a majority of the replica set, the leader included, holds it durably at the leader's generation, with no etcd or control-plane write on the ack path; a new leader persists its ballot, fences every replica, opens only if no replica of the first fenced majority holds a log further ahead (last record's generation, then length), otherwise refuses and the shard stays unavailable; it appends a generation-start record and is settling (no mark, reads not_ready) until a majority holds it",
            "the lease mode's report-before-mark would cost an etcd write on every Quorum publish; majority overlap between the ack majority and the fence majority keeps every acknowledged write in every later leader, which the hypothesis model of felix_broker/replication/core.py checks after every step",
        ),
        "quorum-no-majority-answer": Decision(
            "answer to a Quorum write without a majority in time (semantics says refused, the protocol says quorum_timeout)",
            "error quorum_timeout with retry class outcome_unknown after FELIX_PUBLISH_QUORUM_TIMEOUT_MS; the record may still commit later; a write waiting when leadership moves or the lease lapses gets leadership_lost (outcome_unknown)",
            "the wire table and the protocol are authoritative, and a record durable on the leader can be committed by a later majority, so nothing-applied would be a lie",
        ),
        "publish-refused-without-producer-feature": Decision(
            "a refusal publish_refused would carry, to a client that did not offer FEATURE_IDEMPOTENT_PRODUCER",
            "publish_error (or error) with code invalid_request and the refusal's reason in detail.reason; a non-owner's refusal is publish_error not_leader",
            "the feature bit is how a client says it decodes publish_refused; an answer is still owed, and the generic error shapes are the ones every client decodes",
        ),
        "quorum-group-changes": Decision(
            "how a consumer group's cursor, acks and dead letters of a Quorum stream shard replicate (issue 19: they replicate with their shard)",
            "they ride the stream shard's own replication log: each settle's changes are one ReplicatedGroupChanges entry (spec/fleet.yaml), acknowledged at the quorum mark like a publish and applied in log order to the group log on every replica; a generation-start entry makes every replica rebuild its groups from that log; claims stay in memory (a promoted leader redelivers unacknowledged records, at least once)",
            "a log of their own per shard (as caches have) would need its own promotion, and a replica caught up on the stream could be behind on the group log, leaving groups unavailable with nothing the placer could act on; one log means one ballot, one caught-up check, and a settle always after the records it settles",
        ),
        "quorum-guarded-writes": Decision(
            "where the condition of publish_if and of commit with expected_offset is judged on a Quorum stream (issue 19)",
            "at the batch's place in the replicated log: the leader admits the write without checking, as a ReplicatedBatch carrying expected_offset (and a commit's state changes); every replica checks it against its stream log's raw tail when it applies the committed entry, appends the batch only if it holds, and otherwise writes no record (the entry stays a no-op in the replication log); the leader answers once a majority holds the entry and it is applied here, with the offset or publish_refused offset_mismatch at the tail checked; no majority in time is quorum_timeout (outcome unknown)",
            "a check at the leader before the append would judge a log the replicas may not have (an uncommitted suffix a new leader drops) and would need the check and the append in one step of the driver; checked where it is applied, the outcome is a function of the committed log alone, the same on every replica and on any later leader, as for a Quorum cache's put_if",
        ),
        "quorum-idempotent-producers": Decision(
            "how an idempotent producer's batch (publish_idempotent, binary 0x0100) is deduplicated on a Quorum stream, across failover (issue 19)",
            "at the batch's place in the replicated log, like a guarded write: the leader admits the batch without consulting its producer table, as a ReplicatedBatch carrying producer_id, sequence and digest; every replica judges it against its own producer table (a function of its stream log's producer marks) when it applies the committed entry, appends it with its producer mark only for the next expected sequence (or sequence 0 of an unknown producer), and otherwise writes no record; the leader answers once a majority holds the entry and it is applied here: publish_ok with the offset, or a duplicate's original offset, or publish_refused with the table's reason (sequence_gap {expected}, unknown_producer, sequence_expired, sequence_reused to a client that offered FEATURE_SEQUENCE_REUSED, else the original's publish_ok); no majority in time is quorum_timeout (outcome unknown, resend the same batch)",
            "the producer table is then replicated without a message of its own: it is derived from the committed log, which every replica and every later leader holds, so a promoted leader answers a resend of a batch its predecessor acknowledged as a duplicate (exactly once across failover); a table consulted at the leader before the append would include an uncommitted suffix a new leader drops, and two in-flight resends of one sequence would both pass it",
        ),
        "quorum-retention-cut": Decision(
            "how the replicas of a Quorum stream forget the same idempotent producers at the same place, although each runs its retention at its own time and a restarted one rebuilds its producer table from its own stream log (issue 19)",
            "the leader decides the cut: when its retention policy (the stream's, else the broker's defaults) would move its stream log's start past the last cut, it appends a ReplicatedRetention entry with that start (retain_from) to the shard's replication log; every replica applies it in log order, trimming its producer table there (and only there: a replicated shard's table ignores its own log's start); a replica's local retention never removes a segment holding records at or above the last cut it applied, and the cut it applied is kept in a file of the replica's folder (replaced atomically) so a restart rebuilds the table from its log and trims it at that cut",
            "an idempotent batch is judged against the table at its place in the log (quorum-idempotent-producers), so the table must forget a producer at a place in the log, not at a time; the leader's retention is the natural source of the cut and a follower only ever keeps more records than the cut, never fewer, so its rebuilt table holds every batch at or above the cut; trimming at a time (each replica's retention pass) would let a producer idle for longer than the retention be unknown_producer on one replica and appended on another",
        ),
        "quorum-conditions-feature": Decision(
            "what a fleet member answers a guarded or idempotent write (publish_if, commit, publish_idempotent) to a Quorum stream before the fleet finalized replicated_conditions (issue 19: a follower that predates the replicated judging would append such a batch unconditionally)",
            "error (publish_error for publish_idempotent) with code invalid_request, retry class fatal (the catalogue's default), nothing written, the message naming the feature; plain publishes, and every write to a Leader stream, are served as before; once finalized (one-way) they are admitted as decisions quorum-guarded-writes and quorum-idempotent-producers say",
            "it is the refusal the fleet already gives a commit before atomic_commit (the same kind of switch, the same answer); shard_unavailable (retry) would make clients spin on a shard that serves plain publishes, until an operator acts; publish_refused's reasons are verdicts of the producer table or the offset guard, which a client acts on as facts about its sequence or its offset, and here no condition was judged; not_leader would send it to a leader that refuses it alike",
        ),
        "quorum-cache-snapshots": Decision(
            "how a Quorum cache shard's replication log is compacted and a follower behind the compacted point catches up (issue 19)",
            "every replica snapshots its own cache shard (CacheSnapshot in spec/fleet.yaml: entries in recency order with versions and TTL deadlines, counters, the cache log's tail) once 1024 entries were applied since the last, at an offset it holds durably; its replication log drops entries only below its newest snapshot; a follower whose log ends below the leader's compacted point asks the leader (replica_snapshot_request) for its shard as applied now and rebuilds from it",
            "applying is deterministic, so a snapshot at an offset is the same on every replica and need not be agreed on; a local snapshot costs no peer traffic; the rebuilt cache log ends at the snapshot's tail, so versions stay the offsets they were on every replica",
        ),
        "leader-consistency-replication": Decision(
            "what a Leader-consistency stream with replication factor > 1 ships, promises and does on failover (issue 19)",
            "a durable Leader stream with RF > 1 is replicated like a Quorum one (placed with distinct replicas, the same core, log and peer messages; an in-memory one keeps one copy): a write is acknowledged, applied to the leader's stream log and readable once the leader's own replication log holds it durably (the leader's mark), and shipped to the followers asynchronously; the majority mark (commit) is kept as for Quorum and is what followers apply, compaction and the conflict rule rest on; failover promotes as for Quorum: the candidate fences a majority and opens only if none of it holds a further-ahead log (generation of the last record, then length), so 'caught up' for Leader means the most caught-up replica of a fenced majority (a refused promotion names it and the placer promotes it); a shard with no live majority stays unavailable, never served empty; a former leader (or any replica) holding applied records the new leader does not have truncates them: its stream log is cut back first (Log.truncate, crash-safe), then its replication log",
            "reusing the Quorum machinery keeps one sans-IO core and one wire protocol, and the followers' stream logs are the leader's record for record because they apply the same committed entries; acking at the leader's disk is the Leader promise (a failover may lose what was acknowledged but never shipped), while the majority mark still bounds what any failover can lose; truncating in place rather than re-fetching the shard keeps a rejoin proportional to the divergent suffix, which is at most max_uncommitted entries; a promotion of a single live replica without a fenced majority would risk two leaders taking writes at once",
        ),
    }
)

MESSAGES = MESSAGE_CLASSES
BINARY_LAYOUTS = BINARY_CLASSES
LEGAL_FLAG_VALUES = LAYOUT_BY_FLAG
ERROR_CODES: Mapping[int, ErrorCode] = MappingProxyType({int(c): c for c in ERROR_CLASSES})
FLAGS = FLAG_INFO
FEATURES = FEATURE_INFO

COUNTS: Mapping[str, int] = MappingProxyType(
    {
        "messages": 78,
        "client_to_broker": 38,
        "broker_to_client": 40,
        "flags": 15,
        "binary_layouts": 4,
        "legal_binary_flag_values": 38,
        "features": 36,
        "features_with_known_bits": 35,
        "error_codes": 17,
        "retry_classes": 5,
        "shapes": 25,
        "decisions": 31,
    }
)
