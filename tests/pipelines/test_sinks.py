"""Result sinks: one JSON line per record, appended; bad sink specs are one line."""

import json

import pytest

from jetpipe.errors import JetpipeError
from jetpipe.pipelines.sinks import open_sink


def test_jsonl_appends_one_line_per_record(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"earlier": true}\n')
    sink = open_sink(f"jsonl:{path}")
    sink.write({"stream": 0, "frame": 1, "results": {"boxes": [[1, 2, 3, 4]]}})
    sink.write({"stream": 1, "frame": 2, "results": {}})
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"earlier": True}, {"stream": 0, "frame": 1, "results": {"boxes": [[1, 2, 3, 4]]}},
                     {"stream": 1, "frame": 2, "results": {}}]


def test_stdout_sink_writes_json_lines(capsys):
    sink = open_sink("stdout")
    sink.write({"stream": 3})
    sink.close()
    assert json.loads(capsys.readouterr().out) == {"stream": 3}


@pytest.mark.parametrize("spec, message", [
    ("ftp://x", "use jsonl:PATH, stdout or mqtt://"),
    ("jsonl:/nonexistent-folder/r.jsonl", "folder /nonexistent-folder does not exist"),
])
def test_bad_sinks(spec, message):
    with pytest.raises(JetpipeError, match=message):
        open_sink(spec)
