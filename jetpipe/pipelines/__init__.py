"""Application layer: sources -> batcher -> runtime -> postprocess -> sinks, and the daemon."""
