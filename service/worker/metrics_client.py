"""Worker side of custom metrics: pb_utils' MetricFamily/Metric requests over the control channel.

Requests that need an answer are ipc.MetricCall frames (the calling thread reads the socket itself while it
waits, as BLS calls do). A value update leaves at once as an ipc.MetricUpdate (no reply awaited): it is in the
server's socket before anything the model does next, so a model that reads /metrics right after its update sees
it (the scrape yields to the loop once before rendering). Deletions made by garbage collection are queued and
leave with the next frame, after each batch, or from a background flusher.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from typing import Any

from service.ipc import frames as ipc
from service.worker.channel import WorkerChannel
from service.worker.pb_utils.metrics import Flusher, MetricsSink

_FIRST_ID = 1 << 40  # reply ids of metric calls, apart from any other user of WorkerChannel.pending


class ChannelMetricsSink(MetricsSink):
    """pb_utils' metrics sink in a worker process."""

    def __init__(self, channel: WorkerChannel) -> None:
        super().__init__()
        self.channel = channel
        self._ids = itertools.count(_FIRST_ID)
        self._send_lock = threading.Lock()  # keeps queued updates in order between the flusher and callers
        self._flusher: Flusher | None = None

    def call(self, op: str, **fields: Any) -> Any:
        """Send MetricCall (with every queued update) and wait for its MetricReply."""
        if self._flusher is None:
            self._flusher = Flusher(self.flush)
        call_id = next(self._ids)
        future: Future[Any] = Future()
        self.channel.pending[call_id] = future
        with self._send_lock:
            self.channel.send(ipc.MetricCall(call_id, op, ops=self.take(), **fields))
        reply = self.channel.wait_for(future)
        if reply.error:
            raise RuntimeError(reply.error)
        return reply

    def update(self, op: int, handle: int, value: float) -> None:
        """Send one value update now, after any queued operations (their order kept)."""
        with self._send_lock:
            self.channel.send(ipc.MetricUpdate([*self.take(), (op, handle, value)]))

    def flush(self) -> None:
        """Send the queued updates, if any."""
        if not self.ops:
            return
        with self._send_lock:
            ops = self.take()
            if ops:
                self.channel.send(ipc.MetricUpdate(ops))

    def close(self) -> None:
        """Stop the flusher after a last flush."""
        if self._flusher is not None:
            self._flusher.stop()
        self.flush()
