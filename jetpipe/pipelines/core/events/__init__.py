"""Events: zones and lines per stream (rules), decided from tracked boxes on the frames' clock (engine), as
versioned records (record) delivered by the sinks beside the frames' records, counted in the summary (step)."""

from jetpipe.pipelines.core.events.record import SCHEMA, EventRecord
from jetpipe.pipelines.core.events.rules import Line, RuleError, Zone
from jetpipe.pipelines.core.events.step import EventStep

__all__ = ["SCHEMA", "EventRecord", "EventStep", "Line", "RuleError", "Zone"]
