"""Bundles for other servers: a Triton Inference Server model repository (triton.py)."""
