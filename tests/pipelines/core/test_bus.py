"""The record bus: every record on one path, each subscriber getting the types it asked for, in order."""

from dataclasses import dataclass

from jetpipe.pipelines.core.bus import RecordBus


@dataclass
class Record:
    type: str | None
    n: int = 0


def test_subscribers_get_their_types_in_the_order_they_subscribed():
    bus, seen = RecordBus(), []
    bus.subscribe(lambda r: seen.append(("sinks", r.type)))
    bus.subscribe(lambda r: seen.append(("clips", r.type)), types=("line_cross",))
    bus.subscribe(lambda r, frame: seen.append(("snapshots", r.type, frame)), types=("line_cross", "zone_enter"),
                  frame=True)
    for record, frame in ((Record(None), None), (Record("line_cross"), "image"), (Record("clip_ready"), None),
                          (Record("zone_enter"), None)):
        bus.publish(record, frame)
    assert seen == [("sinks", None),
                    ("sinks", "line_cross"), ("clips", "line_cross"), ("snapshots", "line_cross", "image"),
                    ("sinks", "clip_ready"),
                    ("sinks", "zone_enter"), ("snapshots", "zone_enter", None)]


def test_a_subscriber_added_later_gets_the_types_already_routed():
    """Routes are cached by type: a later subscription must reach types published before it."""
    bus, seen = RecordBus(), []
    bus.subscribe(lambda r: seen.append("first"))
    bus.publish(Record("line_cross"))
    assert not bus.wants_frames()
    bus.subscribe(lambda r, frame: seen.append("second"), frame=True)
    bus.publish(Record("line_cross"))
    assert seen == ["first", "first", "second"] and bus.wants_frames()
