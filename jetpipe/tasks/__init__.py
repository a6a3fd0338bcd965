"""What a model's outputs mean: one module per task, one registry every consumer asks (DESIGN.md, 11)."""

from jetpipe.tasks.base import ModelFacts, Task, TaskError, TaskOptions
from jetpipe.tasks.registry import RAW, TASKS, budget_metrics, choose, detect, for_bundle, get

__all__ = ["RAW", "TASKS", "ModelFacts", "Task", "TaskError", "TaskOptions", "budget_metrics", "choose", "detect",
           "for_bundle", "get"]
