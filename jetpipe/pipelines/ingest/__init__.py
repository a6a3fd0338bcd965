"""Ingest: the streams' sources, their rings and capture, the decode processes, and the batcher
that queues their frames (the first room a frame passes).

Nothing is imported here: the rooms import each module by its path."""
