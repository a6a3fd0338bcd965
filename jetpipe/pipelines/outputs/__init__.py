"""Outputs: the sinks (one fan-out), clips, snapshots, the preview and drawing: where records and
frames leave.

Nothing is imported here: the rooms import each module by its path."""
