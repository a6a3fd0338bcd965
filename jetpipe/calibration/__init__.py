"""Accuracy and latency measurement of bundles, with reports and plots."""
