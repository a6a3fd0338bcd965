"""Closing what start-up opened: each closer, the last registered first (what was opened later may use what
was opened before it), one that fails said and the others still closed."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def close_in_reverse(closers: list) -> None:
    """Call each closer, the last first, and empty the list (a second close does nothing)."""
    for close in reversed(closers):
        try:
            close()
        except Exception as exc:
            log.warning("while closing: %s", exc)
    closers.clear()
