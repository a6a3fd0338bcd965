"""One exception root for the package.

`JetpipeError` messages are written for the user: they name the object, the bad
value and the fix. The CLI prints them on one line and exits non-zero; anything
else is a bug and keeps its traceback.
"""


class JetpipeError(Exception):
    """A problem the user can fix (bad input, missing dependency, mismatch)."""


class ModelError(JetpipeError):
    """The ONNX model cannot be loaded, checked or transformed."""


class CalibrationError(JetpipeError):
    """Calibration data is missing, unreadable or does not match."""


class BundleError(JetpipeError):
    """A bundle is missing, incomplete or fails verification."""


class EngineError(JetpipeError):
    """TensorRT is missing, or building / loading an engine failed."""


def worth_logging(count: int) -> bool:
    """Whether the count-th occurrence of a repeated failure (a decode error, a sink that keeps failing)
    is logged: the 1st, 10th, 100th and every 1000th, so a flood is seen without flooding the log."""
    return count in (1, 10, 100) or count % 1000 == 0


def some(names, shown: int = 12) -> str:
    """The first few of a list for a message ("a, b, c ... (6,625 in all)"): a recognizer's character set made
    an error line of 46 KB."""
    names = [str(n) for n in names]
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} ... ({len(names):,} in all)"
