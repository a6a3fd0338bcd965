"""Clips around events: each stream's compressed packets kept (ring), cut into MP4 files without decoding or
encoding (cut), on an event or a control API request, with a `clip_ready` record in the sinks (writer).

Nothing is imported here: the sources import ring.py, which must not pull in the writer's imports."""
