"""botsort's table of tracks as columns: a row a track, each column an array (no object a track).

The columns are views of the first rows of arrays with room to spare: a pass's new tracks are written into the
spare rows, not every column copied to add them (a busy batch starts tracks every pass). A done track's row is
let go (its slot DEAD: no pass takes it) and the table is closed up, in order, once a quarter of its rows are:
not copied every pass either. Row order is the tracks' age: the solver's tie-breaks and the order IDs are
given in depend on it, and neither changes.
"""

from __future__ import annotations

import numpy as np

DEAD = -1  # the slot of a row let go (read through a slot table one longer than the slots: never a frame)
COLUMNS = ("mean", "cov", "blocks", "obs", "obs_t", "hist", "hist_t", "ids", "hits", "slot", "look", "look_t", "moved",
           "moved_known", "mixed")


class TrackColumns:
    def __init__(self, history: int):
        self._store: dict[str, np.ndarray] = {}
        self.mean, self.cov = np.zeros((0, 8)), np.zeros((0, 8, 8))  # the Kalman filter's (kalman.py)
        # a covariance's four 2 x 2 blocks (kalman.blocks_of): the filter's own where the row is not `mixed` (its
        # cov then left as it was); cov where it is
        self.blocks = np.zeros((0, 16))
        self.obs = np.zeros((0, 4))       # the last observed box
        self.obs_t = np.zeros(0)          # when
        self.hist = np.zeros((0, history, 4))                 # the last observations' boxes, a ring (botsort's
        self.hist_t = np.full((0, history), -np.inf)          # HISTORY) and their times (-inf: none yet)
        self.ids = np.zeros(0, np.int64)  # 0: not confirmed yet
        self.hits = np.zeros(0, np.int64)
        self.slot = np.zeros(0, np.int64)  # the stream slot a track belongs to (DEAD: a row let go)
        self.look, self.look_t = np.zeros((0, 0), np.float32), np.zeros(0)  # looks.py: its look, and when
        # botsort's _motion kept (velocity, what it is measured on, largest size: 6 columns): a lost track's is
        # asked every frame it stays lost, and its history does not change until it is observed or moved
        self.moved, self.moved_known = np.zeros((0, 6)), np.zeros(0, bool)
        # a covariance a camera's rotation mixed (x with y): filtered as 8 x 8 matrices; the others as their four
        # 2 x 2 blocks (kalman.predict_blocks: the same numbers, a quarter of the entries)
        self.mixed = np.zeros(0, bool)
        self._dead = 0  # rows let go, not yet closed up

    def __len__(self) -> int:
        """Tracks (rows let go left out)."""
        return len(self.ids) - self._dead

    def _append(self, count: int, values: dict) -> np.ndarray:
        """`count` new rows after every other, each column's from `values` (an array of `count` rows, or one value
        for all); the columns not given start at 0. Their row numbers."""
        first = len(self.ids)
        self._room(first + count)
        for name in COLUMNS:
            self._store[name][first:first + count] = values.get(name, 0)
        self._view(first + count)
        return np.arange(first, first + count)

    def _room(self, rows: int) -> None:
        """The store holds at least `rows` rows (twice as many when it grows: amortized, as a list's)."""
        if self._store and len(self._store["ids"]) >= rows:
            return
        capacity, used = max(64, 2 * rows), len(self.ids)
        for name in COLUMNS:
            column = getattr(self, name)
            grown = np.empty((capacity, *column.shape[1:]), column.dtype)
            grown[:used] = column
            self._store[name] = grown
        self._view(used)

    def _view(self, rows: int) -> None:
        for name in COLUMNS:
            setattr(self, name, self._store[name][:rows])

    def widen_looks(self, dim: int) -> None:
        """Looks `dim` long (the model's, fixed at its first look): every track's none yet."""
        self._room(len(self.ids))
        self._store["look"] = np.zeros((len(self._store["ids"]), dim), np.float32)
        self._store["look_t"][:] = -np.inf
        self._view(len(self.ids))

    def _keep(self, keep) -> None:
        """The rows not kept are let go (their slot DEAD); the table is closed up, in order, once a quarter of its
        rows are."""
        gone = ~keep & (self.slot != DEAD)
        if not gone.any():
            return  # most batches: the table as it is
        self.slot[gone] = DEAD
        self._dead += int(np.count_nonzero(gone))
        if 4 * self._dead < len(self.ids):
            return
        alive = self.slot != DEAD
        rows = int(np.count_nonzero(alive))
        for name in COLUMNS:
            self._store[name][:rows] = getattr(self, name)[alive]
        self._dead = 0
        self._view(rows)
