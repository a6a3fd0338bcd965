"""Service: the daemon's wiring, its HTTP room (metrics, preview, control API), several GPUs behind one
face, the summary, `serve` and the embedded API.

Nothing is imported here: the rooms import each module by its path."""
