"""Bounds on sizes users choose, stated once (a batch of 100000 frames is a typo, not a plan)."""

MAX_BATCH = 256  # frames per engine batch: --max-batch of convert and serve, calibrate latency --batch
