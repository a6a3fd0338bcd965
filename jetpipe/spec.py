"""Preprocessing spec: how a camera frame becomes the network's input tensor.

Stored in every bundle's manifest, so the runtime, the calibration scripts and
`convert --calib` preprocess identically: x = (pixel * scale - mean) / std.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from jetpipe.errors import JetpipeError

CHANNEL_ORDERS = ("rgb", "bgr", "gray")  # gray: one channel, the frame's luma
RESIZE_MODES = ("letterbox", "stretch", "topleft")  # topleft: letterbox placed at the top left


@dataclass(frozen=True)
class PreprocessSpec:
    """Per-channel normalisation, colour order and resize policy of a network input.

    channel_order "gray": a 1-channel network fed the frame's luma (Y', full range: the Y plane of a
    YUV frame, BT.601 weights of a BGR/RGB one as OpenCV's COLOR_BGR2GRAY); mean and std then hold one
    value each."""

    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    channel_order: str = "rgb"
    resize: str = "letterbox"
    pad_value: float = 114.0  # in pixel units, before scaling (YOLO's grey)

    def __post_init__(self):
        numbers = {"scale": (self.scale,), "mean": self.mean, "std": self.std, "pad value": (self.pad_value,)}
        for name, values in numbers.items():
            if not all(math.isfinite(v) for v in values):  # NaN passes every comparison below
                shown = values[0] if len(values) == 1 else ",".join(f"{v:g}" for v in values)
                raise JetpipeError(f"{name} {shown}: NaN or infinity makes every input NaN; give finite numbers")
        if self.channel_order not in CHANNEL_ORDERS:
            raise JetpipeError(
                f"channel order {self.channel_order!r} is not one of {', '.join(CHANNEL_ORDERS)}"
            )
        if self.resize not in RESIZE_MODES:
            raise JetpipeError(f"resize {self.resize!r} is not one of {', '.join(RESIZE_MODES)}")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise JetpipeError("mean and std need one value each for gray, e.g. --mean 0.5 --std 0.5"
                               if self.channels == 1 else
                               "mean and std need three values each, e.g. --mean 0.485,0.456,0.406")
        if any(s == 0 for s in self.std):
            raise JetpipeError(f"std {self.std} contains 0: every channel needs a non-zero std")
        if self.scale <= 0:
            raise JetpipeError(f"scale {self.scale} must be positive (default 1/255)")
        if not 0 <= self.pad_value <= 255:
            raise JetpipeError(f"pad value {self.pad_value:g} is in pixel units: from 0 to 255 (YOLO's grey: 114)")

    @property
    def channels(self) -> int:
        return 1 if self.channel_order == "gray" else 3

    def for_channels(self, channels: int) -> PreprocessSpec:
        """This spec for a network input of `channels` channels: a 1-channel input is fed gray, with the
        three equal means and stds of a colour spec (the defaults) as one; otherwise the user must say."""
        if channels == self.channels:
            return self
        if channels == 3:
            raise JetpipeError("channel order gray feeds 1-channel networks; this one takes 3 channels: "
                               "use --channel-order rgb or bgr")
        if channels != 1:
            raise JetpipeError(f"the network takes {channels} channels; jetpipe feeds 3 (colour) or 1 (gray)")
        if len(set(self.mean)) != 1 or len(set(self.std)) != 1:
            raise JetpipeError(f"the network takes 1 channel (gray) but mean {list(self.mean)} / std "
                               f"{list(self.std)} are per colour channel: pass one value each, "
                               "e.g. --mean 0.5 --std 0.5")
        return dataclasses.replace(self, channel_order="gray", mean=self.mean[:1], std=self.std[:1])

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PreprocessSpec:
        d = dict(d)
        d["mean"], d["std"] = tuple(d["mean"]), tuple(d["std"])
        return cls(**d)

    def replace(self, **changes) -> PreprocessSpec:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


_IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

# Named presets; explicit --scale/--mean/... flags override single fields.
PRESETS: dict[str, PreprocessSpec] = {
    "none": PreprocessSpec(),
    "imagenet": PreprocessSpec(**_IMAGENET, resize="stretch"),
    "yolo": PreprocessSpec(pad_value=114.0),
    # PaddleOCR feeds OpenCV's BGR image through ImageNet's RGB-ordered statistics.
    "ppocr-det": PreprocessSpec(**_IMAGENET, channel_order="bgr", pad_value=0.0),
    # PP-OCR's recognizer and direction classifier: (x / 255 - 0.5) / 0.5 of the BGR line, resized to the
    # height keeping its aspect, padded on the right with zeros after normalization (127.5 before)
    "ppocr-rec": PreprocessSpec(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), channel_order="bgr", resize="topleft",
                                pad_value=127.5),
}


def preset(name: str) -> PreprocessSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise JetpipeError(
            f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}"
        ) from None
