"""botsort's use of appearance (appearance.py gives the vectors): which boxes need a look, how much a look
says, how looks weigh in the matching, and each track's remembered look.

A track remembers a look: a unit vector, the running mean of its matched detections' (BoT-SORT's exponential
mean, `look_alpha` of the old kept), refreshed when older than `look_every_s`. A pass asks for the looks of
the confident detections that need one, in one call for every frame of it (the model runs on a batch of
crops, not a crop at a time):
- a detection more than one steady track could take, or a track could take more than one of (IoU with the
  prediction at least match_iou): two objects crossing or side by side;
- a detection no steady track could take: a new object, or one coming back from behind something;
- a detection whose one track's look is old or missing.

What a cosine means depends on the model: a person ReID network puts two looks of one person near 0.7 and of
two people near 0.2; the colour cue puts two light signs at 0.95 and one sign's two looks at 0.99. So the
tracker learns it from the scene (LookStats): the cosines of a track's look and its detection where no other
track or detection was near (one object), and of two detections of one frame (two objects). A pair's evidence
is the log-likelihood ratio of its cosine under the two (normal distributions with the running means and
variances): positive says one object, negative two, near zero a cue that cannot tell. In the first round
the evidence weighs in (`look_weight`, capped), and in every round strong evidence of two objects (below
-`look_veto`) forbids the pair; after the rounds of motion, the appearance round: a track lost for a while
takes a detection nothing else took along its way from where it was last seen to where its observed motion
carries it (`look_reach` times the largest side it was seen at, every way: further than the motion rounds
look) where the evidence is at least `look_min`, the best first (the assignment): an object that stopped,
turned or changed speed behind an occluder is known again by its look, and a lost track with a look is
remembered `look_lost_s`, longer than one without.
"""

from __future__ import annotations

import numpy as np

from jetpipe.pipelines.core.tracking import pairs

EVIDENCE_CAP = 8.0   # the log-likelihood ratio a pair's look adds to its similarity at most (x look_weight / cap)
MIN_SAMPLES = 30     # cosines of each kind seen before a look counts
SAMPLE_WEIGHT = 0.01  # a new cosine's weight in the running statistics (about the last 100 of each kind)
PAIRS_A_FRAME = 16   # detections of a frame whose looks give the two-object cosines (120 pairs)


class LookStats:
    """Running mean and variance of two cosines: of one object's two looks (ONE) and two objects' (TWO)."""

    ONE, TWO = 0, 1

    def __init__(self):
        self.mean, self.var, self.count = np.zeros(2), np.full(2, 1e-2), np.zeros(2)

    def add(self, kind: int, cosines: np.ndarray) -> None:
        n = len(cosines)
        if not n:
            return
        total = self.count[kind] + n
        weight = n / total if total * SAMPLE_WEIGHT < 1 else 1 - (1 - SAMPLE_WEIGHT) ** n
        delta = float(cosines.mean()) - self.mean[kind]
        self.mean[kind] += weight * delta
        self.var[kind] = (1 - weight) * (self.var[kind] + weight * delta ** 2) + weight * float(cosines.var())
        self.count[kind] = total

    @property
    def ready(self) -> bool:
        return bool((self.count >= MIN_SAMPLES).all() and self.mean[self.ONE] > self.mean[self.TWO])

    def evidence(self, cosines: np.ndarray) -> np.ndarray:
        """log p(cos | one object) - log p(cos | two): 0 until both kinds were seen enough."""
        if not self.ready:
            return np.zeros(len(cosines))
        sigma = np.sqrt(self.var) + 1e-3
        one = (cosines - self.mean[self.ONE]) / sigma[self.ONE]
        two = (cosines - self.mean[self.TWO]) / sigma[self.TWO]
        return np.clip(np.log(sigma[self.TWO] / sigma[self.ONE]) - one ** 2 / 2 + two ** 2 / 2, -50.0, 50.0)

    def summary(self) -> dict:
        return {"one_object_cosine": round(float(self.mean[self.ONE]), 4),
                "two_objects_cosine": round(float(self.mean[self.TWO]), 4),
                "samples": [int(c) for c in self.count], "used": self.ready}


class PassLooks:
    """The looks a pass fetched: a row a detection of the pass (zero where none was asked); `sure`: the one
    steady track a detection could be (-1: none, or more than one)."""

    def __init__(self, look: np.ndarray, has: np.ndarray, sure: np.ndarray):
        self.look, self.has, self.sure = look, has, sure

    @classmethod
    def none(cls, detections: int) -> PassLooks:
        return cls(np.zeros((detections, 0), np.float32), np.zeros(detections, bool), np.full(detections, -1))

    def evidence(self, table, track: np.ndarray, det: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A pair each: the evidence of its looks that it is one object (LookStats), and whether both have a
        look."""
        both = self.has[det] & np.isfinite(table.look_t[track]) if self.look.shape[1] else np.zeros(len(det), bool)
        evidence = np.zeros(len(det))
        if both.any():
            cos = np.einsum("ij,ij->i", table.look[track[both]], self.look[det[both]])
            evidence[both] = table.look_stats.evidence(cos)
        return evidence, both


def wanted(table, pt, pd, boxes, predicted, lost, high, track_t) -> tuple[np.ndarray, np.ndarray]:
    """Which detections of the pass need a look (a mask), and the one steady track each could be (-1: none or
    more than one); pt, pd: the pass's candidate pairs (track rows, detection indices)."""
    p = table.params
    steady = (table.ids[pt] > 0) & ~lost[pt] & high[pd]
    st, sd = pt[steady], pd[steady]
    could = pairs.iou(predicted[st], boxes[sd]) >= p.match_iou
    st, sd = st[could], sd[could]
    per_track = np.bincount(st, minlength=len(table.ids))
    per_det = np.bincount(sd, minlength=len(boxes))
    wants = high & (per_det == 0)                                   # new, or back from behind something
    contended = (per_track[st] > 1) | (per_det[sd] > 1)             # crossing, side by side
    old = track_t[st] - table.look_t[st] > p.look_every_s           # never seen (-inf) or long ago
    wants[sd[contended | old]] = True
    sure = np.full(len(boxes), -1)
    sure[sd[~contended]] = st[~contended]
    return wants, sure


def fetch(table, embed, keys, counts, boxes, wanted_sure) -> PassLooks:
    """The wanted detections' looks, one call of `embed` for every frame of the pass: embed([(key, boxes of
    that frame)]) -> their unit vectors in that order; keys: each frame's key for embed. Two detections of a
    frame are two objects: their cosines go to the table's LookStats."""
    wants, sure = wanted_sure
    asked = np.flatnonzero(wants)
    if not len(asked):
        return PassLooks.none(len(boxes))
    frame = np.repeat(np.arange(len(counts)), counts)[asked]
    frames = np.unique(frame).tolist()
    rows = np.asarray(embed([(keys[k], boxes[asked[frame == k]]) for k in frames]), np.float32)
    order = np.concatenate([asked[frame == k] for k in frames])
    look = np.zeros((len(boxes), rows.shape[1]), np.float32)
    look[order] = rows
    has = np.zeros(len(boxes), bool)
    has[order] = np.linalg.norm(rows, axis=1) > 0.5  # a box with no pixels came back as zeros
    for k in frames:
        shown = look[asked[(frame == k) & has[asked]][:PAIRS_A_FRAME]]
        table.look_stats.add(LookStats.TWO, (shown @ shown.T)[np.triu_indices(len(shown), 1)])
    return PassLooks(look, has, sure)


def appearance_round(table, looks: PassLooks, pt_free, pd_free, boxes, expected, track_frame, det_frame):
    """Lost tracks (rows) against detections nothing took (indices): reach and look. The matches (track rows,
    detection indices)."""
    p = table.params
    empty = np.zeros(0, np.int64)
    if not len(pt_free) or not len(pd_free) or not table.look_stats.ready:
        return empty, empty
    path = np.concatenate([np.minimum(table.obs[pt_free, :2], expected[pt_free, :2]),  # last seen to expected
                           np.maximum(table.obs[pt_free, 2:], expected[pt_free, 2:])], axis=1)
    # by the largest side it was seen at: its last boxes were cut by what hid it (a sliver at a pillar's edge)
    sides = table.hist[pt_free, :, 2:] - table.hist[pt_free, :, :2]
    seen = np.isfinite(table.hist_t[pt_free])
    side = np.where(seen, sides.max(axis=2), 0.0).max(axis=1)
    margin = (p.look_reach * side)[:, None]
    reach = pairs.Candidates(np.concatenate([path[:, :2] - margin, path[:, 2:] + margin], axis=1),
                             track_frame[pt_free], boxes[pd_free], det_frame[pd_free])
    rt, rd = pt_free[reach.track], pd_free[reach.det]
    evidence, both = looks.evidence(table, rt, rd)
    return pairs.assign(rt, rd, evidence, both & (evidence >= p.look_min), track_frame)


def round_looks(table, looks: PassLooks, track, det) -> tuple[np.ndarray, np.ndarray]:
    """A round's pairs: what their looks add to the similarity (the first round's), and which they forbid (in
    every round: an object coming out from behind a pillar is not the one still hidden there, however well its
    box fits the hidden one's last)."""
    p = table.params
    evidence, both = looks.evidence(table, track, det)
    added = p.look_weight * np.clip(evidence, -EVIDENCE_CAP, EVIDENCE_CAP) / EVIDENCE_CAP
    return added, both & (evidence < -p.look_veto)


def remember(table, rows, cols, looks: PassLooks) -> None:
    """Matched tracks whose detection has a look: their look moves toward it (a track without one takes it);
    where the detection could only be that track, the two looks' cosine goes to LookStats (one object)."""
    if not looks.look.shape[1]:
        return
    _width(table, looks.look.shape[1])
    fresh = looks.has[cols]
    rows, cols = rows[fresh], cols[fresh]
    if not len(rows):
        return
    had = np.isfinite(table.look_t[rows])
    one = had & (looks.sure[cols] == rows)
    table.look_stats.add(LookStats.ONE, np.einsum("ij,ij->i", table.look[rows[one]], looks.look[cols[one]]))
    mixed = np.where(had[:, None], table.params.look_alpha * table.look[rows] + (1 - table.params.look_alpha)
                     * looks.look[cols], looks.look[cols])
    table.look[rows] = mixed / np.maximum(np.linalg.norm(mixed, axis=1, keepdims=True), 1e-12)
    # when it was last seen alone: a look taken beside others does not put off the next one taken alone
    table.look_t[rows[one | ~had]] = table.clock_t[table.slot[rows[one | ~had]]]


def _width(table, dim: int) -> None:
    """The table's looks are `dim` long (the model's; fixed at its first look)."""
    if table.look.shape[1] != dim:
        table.widen_looks(dim)
