"""The task registry: every consumer of a model's outputs (the daemon, convert, calibrate, the CLI) asks here.

Adding a task = one module with a `Task` subclass, listed in TASKS (and, for GPU postprocessing, its
reduction in jetpipe/runtime). Order matters only for recognition: the first task that recognizes a
model's outputs is taken; `raw` fits everything and is never a finding.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from jetpipe.tasks.base import ModelFacts, Task, TaskError, TaskOptions
from jetpipe.tasks.classification import ClassificationTask
from jetpipe.tasks.detection_e2e import EndToEndDetectionTask
from jetpipe.tasks.detection_yolo import YoloDetectionTask
from jetpipe.tasks.embedding import EmbeddingTask
from jetpipe.tasks.pose_yolo import PoseYoloTask
from jetpipe.tasks.raw import RawTask
from jetpipe.tasks.segmentation_yolo import SegmentationYoloTask
from jetpipe.tasks.semantic_segmentation import SemanticSegmentationTask
from jetpipe.tasks.text_detection import TextDetectionTask
from jetpipe.tasks.text_recognition import TextRecognitionTask

log = logging.getLogger(__name__)

TASKS: dict[str, Task] = {t.name: t for t in (TextDetectionTask(), SegmentationYoloTask(), PoseYoloTask(),
                                              YoloDetectionTask(),
                                              TextRecognitionTask(), EndToEndDetectionTask(),
                                              SemanticSegmentationTask(), ClassificationTask(), EmbeddingTask(),
                                              RawTask())}
RAW = "raw"


def get(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise TaskError(f"task {name!r}: choose one of {', '.join(TASKS)}") from None


def detect(facts: ModelFacts) -> tuple[Task, str]:
    """The first task that recognizes the outputs, and why the others did not (for the log)."""
    for task in TASKS.values():
        if task.recognizes(facts):
            return task, ""
    reasons = "; ".join(f"{t.name}: {t.mismatch(facts) or 'not sure enough to pick it unasked'}"
                        for t in TASKS.values() if t.name != RAW)
    return TASKS[RAW], reasons


def choose(name: str | None, facts: ModelFacts, flag: str = "--task") -> Task:
    """The task named (checked against the outputs) or, with none named, the one recognized (raw said)."""
    if name is not None:
        task = get(name)
        reason = task.mismatch(facts)
        if reason:
            raise TaskError(f"{flag} {name}: the model's outputs do not fit: {reason} (pass {flag} raw to get "
                            "the tensors as they are)")
        return task
    task, reasons = detect(facts)
    if task.name == RAW and facts.labels is not None:  # labels that do not fit are a mistake, not a raw model
        unlabelled, _ = detect(replace(facts, labels=None))
        if unlabelled.name != RAW:
            raise TaskError(f"--labels for {unlabelled.name}: {unlabelled.mismatch(facts)}")
    if task.name == RAW:
        log.warning("no task recognizes the outputs %s: results will be raw tensors (%s); pass --task to choose",
                    facts.shapes(), reasons)
    return task


def budget_metrics() -> dict[str, str]:
    """Every metric a task reports -> how a budget bounds it."""
    found = {}
    for task in TASKS.values():
        found.update(task.metrics)
    return found


def for_bundle(manifest: dict, name: str | None = None, flag: str = "task") -> tuple[Task, TaskOptions]:
    """The task a bundle is served or measured as (`name` overrides the manifest's; a bundle with none
    recorded has it recognized from its outputs now), checked against its outputs, with its options."""
    stored = manifest.get("labels")
    facts = ModelFacts.from_io(manifest["io"], manifest["input_size"], manifest.get("metadata"), labels=stored)
    task = choose(name or manifest.get("task"), facts, flag)
    return task, TaskOptions.of(facts, task.labels(facts))
