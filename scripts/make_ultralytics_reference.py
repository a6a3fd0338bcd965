#!/usr/bin/env python3
"""Write tests/data/ultralytics_reference.npz: YOLOv8-pose and YOLOv8-seg head outputs with planted objects
(overlapping duplicates included, for NMS), and what Ultralytics' own postprocessing makes of them
(`nms.non_max_suppression`, then the keypoints as its pose predictor takes them and the masks of
`ops.process_mask`). The pose-yolo and segmentation-yolo tests compare jetpipe's CPU path with it.

Runs where Ultralytics is installed (a scratch venv: `pip install ultralytics torch`), not in jetpipe's:

  python scripts/make_ultralytics_reference.py [-o tests/data/ultralytics_reference.npz]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SIZE = 160                        # network input, square
ANCHORS = sum((SIZE // s) ** 2 for s in (8, 16, 32))
CONF, IOU = 0.25, 0.45


def planted_head(rng, classes: int, extra: int, objects: int) -> np.ndarray:
    """[1, 4 + classes + extra, A]: low scores everywhere, `objects` boxes with high ones, each with a
    shifted duplicate of lower score (NMS removes it) and random extra rows."""
    head = np.zeros((4 + classes + extra, ANCHORS), np.float32)
    head[:4] = rng.uniform(10, SIZE - 10, (4, ANCHORS))
    head[2:4] = rng.uniform(4, 30, (2, ANCHORS))
    head[4:4 + classes] = rng.uniform(0, 0.2, (classes, ANCHORS))
    head[4 + classes:] = rng.normal(0, 1, (extra, ANCHORS))
    columns = rng.choice(ANCHORS, 2 * objects, replace=False)
    for k in range(objects):
        main, duplicate = columns[2 * k], columns[2 * k + 1]
        cx, cy = rng.uniform(30, SIZE - 30, 2)
        w, h = rng.uniform(20, 60, 2)
        cls = int(rng.integers(classes))
        head[:4, main] = cx, cy, w, h
        head[4 + cls, main] = rng.uniform(0.5, 0.95)
        head[:4, duplicate] = cx + 2, cy - 2, w, h
        head[4 + cls, duplicate] = head[4 + cls, main] - 0.1
    return head[None]


def main() -> None:
    import torch
    from ultralytics.utils import nms, ops

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, default=Path("tests/data/ultralytics_reference.npz"))
    args = parser.parse_args()
    rng = np.random.default_rng(24)

    pose = planted_head(rng, 1, 17 * 3, objects=7)
    for column in range(ANCHORS):  # keypoints inside each box; visibility a probability (the head's sigmoid)
        cx, cy, w, h = pose[0, :4, column]
        kpts = pose[0, 5:, column].reshape(17, 3)
        kpts[:, 0] = cx + rng.uniform(-w / 2, w / 2, 17)
        kpts[:, 1] = cy + rng.uniform(-h / 2, h / 2, 17)
        kpts[:, 2] = rng.uniform(0, 1, 17)
        pose[0, 5:, column] = kpts.reshape(-1)
    (found,) = nms.non_max_suppression(torch.from_numpy(pose), CONF, IOU, nc=1, max_det=300)
    found = found.numpy()

    classes, coefficients = 3, 32
    seg = planted_head(rng, classes, coefficients, objects=6)
    protos = rng.normal(0, 2, (1, coefficients, SIZE // 4, SIZE // 4)).astype(np.float32)
    (kept,) = nms.non_max_suppression(torch.from_numpy(seg), CONF, IOU, nc=classes, max_det=300)
    masks = ops.process_mask(torch.from_numpy(protos[0]), kept[:, 6:], kept[:, :4], (SIZE, SIZE), upsample=True)
    kept, masks = kept.numpy(), masks.numpy() > 0

    args.output.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.output, size=SIZE, conf=CONF, iou=IOU,
                        pose_head=pose, pose_boxes=found[:, :4], pose_scores=found[:, 4], pose_classes=found[:, 5],
                        pose_keypoints=found[:, 6:].reshape(-1, 17, 3),
                        seg_head=seg, seg_protos=protos, seg_boxes=kept[:, :4], seg_scores=kept[:, 4],
                        seg_classes=kept[:, 5], seg_masks=np.packbits(masks, axis=-1), seg_classes_count=classes)
    print(f"{args.output}: pose {len(found)} objects, seg {len(kept)} objects")


if __name__ == "__main__":
    main()
