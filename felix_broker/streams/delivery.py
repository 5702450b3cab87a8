"""One subscription's writer: its event stream from the first frame to the last.

It writes `event_stream_hello`, then, on a durable shard, history read from the
log up to the first frame the live subscriber queued, then live frames. Every
frame is checked against the position (the next offset owed), so the seam
between history and live delivery shows no gap and no duplicate: frames already
covered are skipped, a frame straddling the position is re-read from the log.
A gap after that means the subscriber's queue dropped records: a client that
negotiated it gets `subscription_lagged` (resume_from = the position) and the
stream ends (S10); others see the gap in the offsets. On an in-memory
shard there are no offsets, and frames are written as they come.

History is read off the event loop (`Log.aread`), and every loop over it stops
when a read makes no progress: a history read that retention overtook ends
the replay (live delivery takes over; the gap is reported as lagged to a
client that negotiated it), never spins.
"""

from __future__ import annotations

import asyncio
import logging

from felix_broker.storage import OffsetOutOfRangeError
from felix_broker.streams.engine import Chunk, Subscriber, encode_events
from felix_transport import ConnectionClosedError, Stream, StreamClosedError
from felix_wire.codec import encode_frame
from felix_wire.messages import EventStreamHello, ShardMoved, SubscriptionLagged

__all__ = ["SubscriptionWriter"]

_log = logging.getLogger(__name__)


class SubscriptionWriter:
    """Feeds one subscriber's event stream until the client stops it, the connection
    goes, or the broker ends the subscription (its stream was deleted: FIN)."""

    def __init__(self, sub: Subscriber, uni: Stream, *, max_records: int, max_bytes: int) -> None:
        self.sub = sub
        self.uni = uni
        self._max_records = max_records  # one history read: a few delivery batches
        self._max_bytes = max_bytes

    async def run(self, start: int | None, lagged_capable: bool) -> None:
        """`start` is the first offset to deliver on a durable shard, None in memory."""
        sub, uni = self.sub, self.uni
        stopper = asyncio.get_running_loop().create_task(uni.wait_stopped())
        stopper.add_done_callback(lambda _t: sub.close())
        try:
            await uni.write(encode_frame(EventStreamHello(subscription_id=sub.subscription_id)))
            position = await self._replay(start) if start is not None else None
            while True:
                frames = await sub.next_frames()
                if not frames:
                    if sub.moved is not None and not sub.closed:
                        if sub.lagged and lagged_capable and position is not None:
                            await self._lagged([], position)  # lagged, instead of moved
                        else:
                            await self._moved(position)
                        return
                    if uni.stop_sending_code is None:
                        await uni.finish()  # ended by the broker: FIN
                    return
                out: list[bytes] = []
                for frame, count, base in frames:
                    if position is None:
                        out.append(frame)
                        continue
                    end = base + count
                    if end <= position:
                        continue  # history already delivered these
                    if base > position and lagged_capable:
                        await self._lagged(out, position)
                        return
                    if base < position:
                        # Straddles the seam: the rest comes from the log.
                        reached = await self._fill(out, position, end)
                        if reached < end:
                            # The log no longer has [reached, end) (retention removed
                            # it): the records are lost to this subscriber.
                            if lagged_capable:
                                await self._lagged(out, reached)
                                return
                            _log.warning(
                                "subscription %d: records %d-%d left the log before "
                                "delivery; skipped",
                                sub.subscription_id,
                                reached,
                                end - 1,
                            )
                    else:
                        out.append(frame)
                    position = end
                if out:
                    await uni.write(out[0] if len(out) == 1 else b"".join(out))
                if sub.lagged and lagged_capable and position is not None:
                    await self._lagged([], position)
                    return
        except (StreamClosedError, ConnectionClosedError):
            pass
        finally:
            stopper.cancel()

    async def _moved(self, position: int | None) -> None:
        """The shard moved: shard_moved (to a client that offered FEATURE_SHARD_MOVED)
        naming where the shard went and `position`, the first offset not offered to
        this reader (durable streams only), then FIN."""
        sub = self.sub
        assert sub.moved is not None
        node_id, addr, generation = sub.moved
        if sub.shard_moved_capable:
            moved = ShardMoved(
                subscription_id=sub.subscription_id,
                resume_from=position,
                node_id=node_id,
                addr=addr,
                generation=generation,
            )
            await self.uni.write(encode_frame(moved), end_stream=True)
        elif self.uni.stop_sending_code is None:
            await self.uni.finish()
        sub.close()

    async def _lagged(self, out: list[bytes], resume: int) -> None:
        """What was queued before the drop, then subscription_lagged, then FIN."""
        sub = self.sub
        lagged = encode_frame(
            SubscriptionLagged(subscription_id=sub.subscription_id, resume_from=resume)
        )
        await self.uni.write(b"".join([*out, lagged]), end_stream=True)
        sub.close()

    async def _replay(self, start: int) -> int:
        """History from `start` up to the first queued live frame (or the readable
        tail); returns the next offset owed."""
        sub = self.sub
        log = sub.shard.log
        assert log is not None
        position = start
        while not sub.ending:
            head = sub.first_queued_base()
            target = head if head is not None else log.readable_offset
            if position >= target:
                break
            frames, reached = await self._history(position, target)
            if reached == position:
                break  # nothing readable here any more: live delivery takes over
            await self.uni.write(b"".join(frames))
            position = reached
        return position

    async def _fill(self, out: list[bytes], start: int, end: int) -> int:
        """History from [start, end) appended to `out`; returns the offset reached,
        `end` unless the log stopped giving records (each read must make progress,
        so this ends after at most end - start reads)."""
        position = start
        while position < end:
            frames, reached = await self._history(position, end)
            if reached <= position:
                break
            out.extend(frames)
            position = reached
        return position

    async def _history(self, start: int, end: int) -> tuple[list[bytes], int]:
        """Records from [start, end) laid out for the subscriber's variant, as much as
        one capped read gives (read off the event loop), and the offset after the last
        one; `start` itself when the log has none of them (any more)."""
        sub = self.sub
        log = sub.shard.log
        assert log is not None
        try:
            records = await log.aread(
                start, max_records=self._max_records, max_bytes=self._max_bytes, end=end
            )
        except OffsetOutOfRangeError:
            return [], start
        if not records:
            return [], start
        chunks = [Chunk([r.payload], r.publisher, r.offset, [r.timestamp_us]) for r in records]
        cut = sub.shard.cut(chunks, sub.variant.publisher)
        spec = sub.shard.spec
        frames = [encode_events(sub.variant, spec, chunk, sub.subscription_id) for chunk in cut]
        return frames, records[-1].offset + 1
