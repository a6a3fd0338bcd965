"""One path for every record: the frames' results, the rules' events, clip_ready and snapshot_ready.

Producers publish (the stage loops a frame's record, the events step its events, the clips and snapshots
their notices); subscribers get the records of the types they asked for, in the order they subscribed, in
the producer's thread. The sinks subscribe to everything (their queue hands it to the writer thread); the
clips to the events they cut clips around; the snapshots to the events they picture, with the event's frame
while it is still in its ring slot (publish(record, frame)). A frame's pixels for the drawing sinks take the
sinks' own way (SinkFanout.offer): they are offered under back pressure, not published.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Handler = Callable[..., None]


class RecordBus:
    def __init__(self):
        self._subscribers: list[tuple[frozenset | None, Handler, bool]] = []
        self._routes: dict[str | None, list[tuple[Handler, bool]]] = {}  # a record type's subscribers, in order

    def subscribe(self, handler: Handler, types: Iterable[str] | None = None, frame: bool = False) -> None:
        """handler(record) for every record (types None) or those of `types`; frame=True: handler(record,
        frame), the frame the producer published with the record (None where it had none)."""
        self._subscribers.append((None if types is None else frozenset(types), handler, frame))
        self._routes.clear()

    def wants_frames(self) -> bool:
        """Whether any subscriber takes frames (the events step keeps its events' frames only then)."""
        return any(frame for _, _, frame in self._subscribers)

    def publish(self, record, frame=None) -> None:
        route = self._routes.get(record.type)
        if route is None:
            route = self._routes[record.type] = [(handler, wants) for types, handler, wants in self._subscribers
                                                 if types is None or record.type in types]
        for handler, wants_frame in route:
            if wants_frame:
                handler(record, frame)
            else:
                handler(record)
