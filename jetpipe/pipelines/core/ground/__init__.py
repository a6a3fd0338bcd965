"""Where tracked objects are on the ground, how fast they go and where to: a stream's calibration
(`[[calibration]]`: image points and their positions in metres, calibration.py) and the step that turns each
confirmed track's boxes into positions, speeds and headings (motion.py). The speed rules read them
(a zone's or a line's `speed_limit_kmh`)."""

from jetpipe.pipelines.core.ground.calibration import Calibration, CalibrationError, GroundPlane, check, from_table
from jetpipe.pipelines.core.ground.motion import GroundMotion, GroundStep

__all__ = ["Calibration", "CalibrationError", "GroundMotion", "GroundPlane", "GroundStep", "check", "from_table"]
