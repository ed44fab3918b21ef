"""A job's progress as server-sent events, on the server's side: the hub the worker publishes into
and each stream reads from. The events themselves (ProgressData, PreviewData, EndData) are the
wire's (wire/events.py), which RemoteEngine reads back.

The worker publishes into a ProgressHub (from its thread); each stream reads the job's feed from
its own cursor and is woken when something new arrives. Memory is bounded whatever the clients
do: a feed keeps its last FEED_EVENTS progress events and only its newest preview (a client
that fell behind, or reconnects with a Last-Event-ID the feed no longer holds, gets the newest
state instead of the history), the hub keeps MAX_FEEDS feeds (finished ones are dropped first),
and a stream holds a cursor and an asyncio.Event, never a queue of its own.

Event ids are `<hub>-<seq>`: `hub` names this server's run, so a Last-Event-ID from before a
restart is recognised as stale and answered with the current state.
"""
from __future__ import annotations

import asyncio
import secrets
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ..progress import PreviewFrame, ProgressEvent
from ..wire.events import END_EVENT, PREVIEW_EVENT, PROGRESS_EVENT, EndData, EndStatus, PreviewData, ProgressData
from ..wire.videos import JobStatus, VideoJob

FEED_EVENTS = 256           # progress events a feed keeps for clients that reconnect
MAX_FEEDS = 64              # jobs with a feed; the oldest finished ones go first
KEEPALIVE_SECONDS = 15.0    # a comment line this often keeps proxies from closing a quiet stream


@dataclass(frozen=True)
class FeedEvent:
    seq: int
    kind: str
    data: str                      # the JSON body


@dataclass
class _Feed:
    events: deque[FeedEvent] = field(default_factory=lambda: deque(maxlen=FEED_EVENTS))
    preview: FeedEvent | None = None
    seq: int = 0
    ended: bool = False
    waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=set)


class ProgressHub:
    """The feeds of the jobs this server runs; publishing is thread-safe, reading is for the
    event loop's streams."""

    def __init__(self) -> None:
        self.run_id = secrets.token_hex(4)
        self._feeds: OrderedDict[str, _Feed] = OrderedDict()
        self._guard = threading.Lock()

    # ------------------------------------------------------------------ publishing (worker thread)

    def progress(self, job_id: str, event: ProgressEvent, *, progress: int,
                 status: JobStatus = JobStatus.IN_PROGRESS) -> None:
        data = ProgressData(id=job_id, status=status, phase=event.phase, done=event.done,
                            total=event.total, fraction=event.fraction, progress=progress, eta=event.eta,
                            elapsed=event.elapsed)
        self._publish(job_id, PROGRESS_EVENT, data.model_dump_json())

    def preview(self, job_id: str, preview: PreviewFrame) -> None:
        self._publish(job_id, PREVIEW_EVENT, PreviewData.of(job_id, preview).model_dump_json())

    def end(self, job_id: str, status: EndStatus, job: VideoJob | None) -> None:
        self._publish(job_id, END_EVENT, EndData(id=job_id, status=status, job=job).model_dump_json())

    def _publish(self, job_id: str, kind: str, data: str) -> None:
        with self._guard:
            feed = self._feed(job_id)
            if feed.ended:
                return
            feed.seq += 1
            event = FeedEvent(feed.seq, kind, data)
            if kind == PREVIEW_EVENT:
                feed.preview = event
            else:
                feed.events.append(event)
            feed.ended = kind == END_EVENT
            waiters = list(feed.waiters)
        for loop, wake in waiters:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:      # that stream's loop is closed: the server is stopping
                pass

    def _feed(self, job_id: str) -> _Feed:
        feed = self._feeds.get(job_id)
        if feed is None:
            feed = self._feeds[job_id] = _Feed()
            while len(self._feeds) > MAX_FEEDS:
                victim = next((key for key, old in self._feeds.items() if old.ended and not old.waiters),
                              next(iter(self._feeds)))
                del self._feeds[victim]
        return feed

    # ------------------------------------------------------------------ reading (event loop)

    def subscribe(self, job_id: str, wake: asyncio.Event) -> None:
        with self._guard:
            self._feed(job_id).waiters.add((asyncio.get_running_loop(), wake))

    def unsubscribe(self, job_id: str, wake: asyncio.Event) -> None:
        with self._guard:
            feed = self._feeds.get(job_id)
            if feed is not None:
                feed.waiters = {waiter for waiter in feed.waiters if waiter[1] is not wake}

    def watched(self) -> set[str]:
        """The jobs some stream is following now."""
        with self._guard:
            return {job_id for job_id, feed in self._feeds.items() if feed.waiters}

    def since(self, job_id: str, cursor: int) -> list[FeedEvent]:
        """The job's events after `cursor`, in order. A cursor older than the feed's first kept
        event gets the newest progress (and preview) only: the client has the state, not the history."""
        with self._guard:
            feed = self._feeds.get(job_id)
            if feed is None:
                return []
            events = [event for event in feed.events if event.seq > cursor]
            if events and feed.events and cursor < feed.events[0].seq - 1:
                events = [event for event in events if event.kind == END_EVENT] or events[-1:]
            if feed.preview is not None and feed.preview.seq > cursor:
                events.append(feed.preview)
            return sorted(events, key=lambda event: event.seq)

    def last_seq(self, job_id: str) -> int:
        with self._guard:
            feed = self._feeds.get(job_id)
            return 0 if feed is None else feed.seq

    def event_id(self, seq: int) -> str:
        return f"{self.run_id}-{seq}"

    def cursor_of(self, last_event_id: str | None) -> int:
        """The sequence number a client's Last-Event-ID names; 0 (everything there is) for none,
        a malformed one, or one from another run of the server."""
        run, _, seq = (last_event_id or "").partition("-")
        return int(seq) if run == self.run_id and seq.isdigit() else 0


class StreamSlots:
    """Open event streams, bounded in all and per client address (a stream costs a connection
    and a task; these bounds keep one client from holding the server's)."""

    def __init__(self, total: int = 64, per_client: int = 8) -> None:
        self.total, self.per_client = total, per_client
        self._open: dict[str, int] = {}
        self._guard = threading.Lock()

    def take(self, client: str) -> bool:
        with self._guard:
            if sum(self._open.values()) >= self.total or self._open.get(client, 0) >= self.per_client:
                return False
            self._open[client] = self._open.get(client, 0) + 1
            return True

    def held(self, client: str) -> int:
        with self._guard:
            return self._open.get(client, 0)

    def give_back(self, client: str) -> None:
        with self._guard:
            left = self._open.get(client, 0) - 1
            if left > 0:
                self._open[client] = left
            else:
                self._open.pop(client, None)


__all__ = ["FEED_EVENTS", "FeedEvent", "KEEPALIVE_SECONDS", "MAX_FEEDS", "ProgressHub", "StreamSlots"]
