"""Continuous recording: each stream's own packets written as segments within a disk budget, and their index."""
