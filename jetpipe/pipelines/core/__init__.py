"""Core: the stages between the batcher and the sinks (GPU, post, secondary), the per-frame steps
(tracker, events) and a frame's record.

Nothing is imported here: the rooms import each module by its path."""
