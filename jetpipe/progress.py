"""Progress bars with an ETA for every step that can take more than a few seconds (tqdm, on stderr).

Off with --quiet, and by itself where stderr is not a terminal (CI logs, files)."""

from __future__ import annotations

import sys


def bar(total: int, what: str, unit: str = "step", enabled: bool = True):
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit=unit, disable=None if enabled else True, file=sys.stderr,
                leave=False, dynamic_ncols=True)


class Silent:
    """A bar that shows nothing: the default where no progress is wanted."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def silent(total: int = 0, what: str = "", unit: str = "step") -> Silent:
    return Silent()
