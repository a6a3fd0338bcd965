"""Events: zones and lines per stream (rules), decided from tracked boxes on the frames' clock (engine), as
versioned records (record) delivered by the sinks beside the frames' records, counted in the summary (step)."""

from jetpipe.pipelines.events.record import SCHEMA, EventRecord
from jetpipe.pipelines.events.rules import Line, RuleError, Zone
from jetpipe.pipelines.events.step import EventStep

__all__ = ["SCHEMA", "EventRecord", "EventStep", "Line", "RuleError", "Zone"]
