"""The control API's rules: zones and lines listed, added, changed and removed while serving.

    GET    /rules          every rule as its [[zone]] / [[line]] table, with "kind" and its "counts" so far
    POST   /rules          {"kind": "zone" | "line", the table's keys}: checked as the config checks them; 201
    GET    /rules/NAME     one rule
    PUT    /rules/NAME     {"kind", the table's keys}: the rule replaced (its states start anew, its counts go on)
    DELETE /rules/NAME     the rule removed (its counts stay in the summary, under `removed`; a rule added later
                           under its name counts from zero)

NAME is percent-decoded (a rule named café is /rules/caf%C3%A9).

Errors as for /streams: 400 a rule that does not check (the same one line as at start-up), 404 no such rule,
409 a name taken, or no tracker to count with. Requests run in the HTTP server's threads.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from jetpipe.pipelines.config import ConfigError, check_speed_rule
from jetpipe.pipelines.core.events import rules
from jetpipe.pipelines.ingest.streams import ControlError

KINDS = ("zone", "line")


class RuleRoutes:
    def __init__(self, events, labels, classes: int | None = None, calibrations: dict | None = None):
        """events: the pipeline's events.EventStep (None: no tracker, so no rules); labels: the model's class
        names, which rules may name; classes: how many classes it has (None: not known); calibrations: stream
        -> ground.Calibration (a rule's speed limit needs its streams')."""
        self.events, self.labels, self.classes = events, labels, classes
        self.calibrations = calibrations or {}

    def handles(self, path: str) -> bool:
        return path == "/rules" or path.startswith("/rules/")

    def route(self, method: str, path: str, table) -> tuple[int, object]:
        """(status, JSON value); `table`: the request's body, read as JSON (None for GET and DELETE)."""
        if self.events is None:
            raise ControlError(409, "rules count tracks and this pipeline tracks nothing: start it with --tracker "
                                    "botsort (or a --zone / --line, which turns it on)")
        if path == "/rules":
            if method == "GET":
                return 200, self.events.tables()
            if method == "POST":
                rule = self._checked(table, f"POST {path}")
                if self.events.named(rule.name) is not None:
                    raise ControlError(409, f"POST /rules: a rule is named {rule.name!r} already: PUT /rules/"
                                            f"{quote(rule.name)} changes it")
                self._check_count([*self.events.rule_tables(), rule], f"POST {path}")
                self.events.add(rule)
                return 201, self.events.named(rule.name)
            raise ControlError(405, f"{method} /rules: use GET (list) or POST (add)")
        try:
            name = unquote(path[len("/rules/"):], errors="strict")
        except UnicodeDecodeError:
            raise ControlError(400, f"{path[:100]}: the rule's name is not UTF-8 once percent-decoded") from None
        if self.events.named(name) is None:
            raise ControlError(404, f"{path[:100]}: no such rule (GET /rules lists them)")
        if method == "GET":
            return 200, self.events.named(name)
        if method == "PUT":
            if isinstance(table, dict) and table.get("name", name) != name:
                raise ControlError(400, f"PUT {path}: the body names {table['name']!r}: a rule keeps its name "
                                        "(DELETE it and POST the new one to rename it)")
            rule = self._checked({**table, "name": name} if isinstance(table, dict) else table, f"PUT {path}")
            self._check_count([r if r.name != name else rule for r in self.events.rule_tables()], f"PUT {path}")
            self.events.change(rule)
            return 200, self.events.named(name)
        if method == "DELETE":
            self.events.remove(name)
            return 200, {"removed": name}
        raise ControlError(405, f"{method} {path}: use GET, PUT or DELETE")

    def _checked(self, table, where: str):
        """The rule a body describes, checked as the config checks a [[zone]] / [[line]] table."""
        if not isinstance(table, dict) or table.get("kind") not in KINDS:
            raise ControlError(400, f'{where}: send a zone or a line, e.g. {{"kind": "line", "name": "door", '
                                    '"points": [[0.5, 0], [0.5, 1]]}')
        kind = table["kind"]
        table = {k: v for k, v in table.items() if k not in ("kind", "counts")}  # a GET's answer may be sent back
        try:
            rule = rules.from_table(table, kind, where)
            rules.check_against([rule], 0, self.labels, True, where, self.classes)
            if rule.speed_limit_kmh:
                check_speed_rule(rule, self.calibrations, where)
        except (rules.RuleError, ConfigError) as exc:
            raise ControlError(400, str(exc)) from None
        return rule

    @staticmethod
    def _check_count(every: list, where: str) -> None:
        """The rules as they would be, within the caps (rules.check_count): 409 where not."""
        try:
            rules.check_count(every, where)
        except rules.RuleError as exc:
            raise ControlError(409, f"{exc}: DELETE one first") from None
