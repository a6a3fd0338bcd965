"""The frames a second a configuration's streams offer the primary model, before any is opened: what
`model_instances = "auto"` weighs against the model's measured rate (runtime/instances.py)."""

from __future__ import annotations

import math

from jetpipe import uri as uris
from jetpipe.errors import JetpipeError

CAMERA_FPS = 30.0  # a camera's or network stream's rate is known once it is read; 30 is what most send


def offered_fps(sources) -> float:
    """Summed over the SourceConfigs: a camera, network stream or --realtime file CAMERA_FPS, a synthetic camera
    its own rate, a file read as fast as it decodes inf (it offers whatever the model takes)."""
    total = 0.0
    for spec in sources:
        try:
            source = uris.parse(spec.uri)
        except JetpipeError:
            continue  # refused where it is opened, in one line
        if source.scheme == "synthetic":
            total += uris.synthetic_spec(source)[2]
        elif source.live or spec.realtime:
            total += CAMERA_FPS
        else:
            return math.inf
    return total


def instance_options(config) -> dict:
    """The GPU runtime's model instances as configured, and what auto weighs."""
    auto = config.model_instances == "auto"
    return {"instances": config.model_instances, "offered_fps": offered_fps(config.sources) if auto else 0.0}
