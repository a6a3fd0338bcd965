"""The README's commands run as written: every `jetpipe` command in it (and in the guides under docs/) parses
with the CLI as it is, and the tour block runs, command after command, in a fresh folder."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jetpipe.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
GUIDES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """(the heading above it, its lines) of every fenced code block."""
    blocks, heading, current = [], "", None
    for line in text.splitlines():
        if current is None and line.startswith("#"):
            heading = line.lstrip("# ").strip()
        if line.strip().startswith("```"):
            if current is None:
                current = [] if line.strip() in ("```", "```sh", "```bash", "```console") else None
                if current is None:  # another language (python, toml, json): skipped whole
                    current = False
            else:
                if current is not False:
                    blocks.append((heading, current))
                current = None
        elif current not in (None, False):
            current.append(line)
    return blocks


def _commands(lines: list[str]) -> list[list[str]]:
    """The jetpipe commands of a block as argv (after `$ `, continuation lines joined, comments dropped)."""
    commands, pending = [], ""
    for line in lines:
        line = pending + line.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        line = line.removeprefix("$ ")
        argv = shlex.split(line, comments=True)
        synopsis = any(a.startswith("[") for a in argv)  # `jetpipe convert MODEL [--precision ...]`: a usage line
        if argv and Path(argv[0]).name == "jetpipe" and not synopsis:
            commands.append(argv)
    return commands


def _all_commands():
    for guide in GUIDES:
        for _heading, lines in _blocks(guide.read_text(encoding="utf-8")):
            for argv in _commands(lines):
                yield pytest.param(argv, id=f"{guide.name}: {' '.join(argv)[:60]}")


@pytest.mark.parametrize("argv", list(_all_commands()))
def test_every_documented_command_parses(argv, capsys):
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse says what it did not take
        pytest.fail(f"{' '.join(argv)}: {capsys.readouterr().err.strip()} (exit {exc.code})")


def test_the_tour_runs_as_written(tmp_path):
    pytest.importorskip("rapidocr_onnxruntime", reason="the built-in models need jetpipe[models]")
    tour = [_commands(lines) for heading, lines in _blocks((ROOT / "README.md").read_text()) if heading == "A tour"]
    commands = next((c for c in tour if c), [])
    assert len(commands) >= 5
    for argv in commands:
        done = subprocess.run([sys.executable, "-m", "jetpipe", *argv[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr[-2000:]}"
    assert (tmp_path / "results.jsonl").read_text().count("\n") > 0
    assert (tmp_path / "reports" / "accuracy" / "report.md").is_file()
    assert (tmp_path / "triton-models" / "det" / "config.pbtxt").is_file()
