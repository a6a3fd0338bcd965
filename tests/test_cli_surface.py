"""The whole CLI surface, table-driven: every flag with wrong types, out-of-range values, missing and unknown
options gives exit 2, one line naming the problem, no traceback, and writes nothing."""

import argparse
import json

import pytest

from jetpipe.cli import build_parser, main, parsers
from tests.helpers import residual_cnn, save


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("surface")
    model = save(residual_cnn(batch=1), folder / "tiny.onnx")
    assert main(["convert", model, "-o", str(folder / "b"), "--max-batch", "2", "--quiet"]) == 0
    return {"model": model, "bundle": str(folder / "b")}


def _run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own checks exit through SystemExit
        return exc.code


CONVERT = [
    (["--max-batch", "x"], "--max-batch: invalid int value: 'x'"),
    (["--max-batch", "0"], "--max-batch 0 must be from 1 to 256"),
    (["--max-batch", "100000"], "--max-batch 100000 must be from 1 to 256"),
    (["--calib-size", "many"], "--calib-size: invalid int value"),
    (["--precision", "int4"], "--precision: invalid choice: 'int4'"),
    (["--precision", "int8", "--calib", "synthetic", "--calib-size", "0"], "--calib-size 0 must be at least 1"),
    (["--input-size", "big"], "must look like HxW"),
    (["--mean", "1,2"], "--mean '1,2' must be three"),
    (["--std", "a,b,c"], "--std"),
    (["--scale", "half"], "--scale: invalid float value"),
    (["--scale", "nan"], "scale nan: NaN or infinity makes every input NaN"),
    (["--mean", "0.5,inf,0.5"], "mean 0.5,inf,0.5: NaN or infinity"),
    (["--std", "nan"], "std nan: NaN or infinity"),
    (["--prune", "2"], "--prune"),
    (["--prune", "0.3", "--prune-align", "0"], "--prune-align"),
    (["--calib-method", "magic"], "--calib-method: invalid choice"),
    (["--workspace", "lots"], "--workspace: invalid int value"),
    (["--sparsity", "1:2"], "--sparsity: invalid choice"),
    (["--engine-family", "tensorrt-lite"], "--engine-family: invalid choice: 'tensorrt-lite'"),
    (["--rtx-targets", "sm90"], "--rtx-targets 'sm90': name one or more of sm75, sm80"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--task", "detection-yolo"], "--task detection-yolo: the model's outputs do not fit: expects one output"),
    (["--task", "text-recognition"], "--task text-recognition: the model's outputs do not fit: expects one output"),
    (["--labels", "{tmp}/none.txt"], "--labels .*none.txt: no such file"),
    (["--calib-batch", "0"], "--calib-batch 0: images per calibration run, from 1 to 256"),
    (["--workspace", "-1"], "--workspace -1: MiB from 1 to 1048576"),
    (["--dla", "-1"], "--dla -1: a DLA core number from 0"),
    (["--pad-value", "1e9"], "pad value 1e\\+09 is in pixel units: from 0 to 255"),
    (["--input-size", "100000x100000"], "--input-size: sides from 1 to 16384 pixels"),
]


@pytest.mark.parametrize("args, message", CONVERT)
def test_convert_flags(made, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    args = [a.format(tmp=tmp_path) for a in args]
    assert _run(["convert", made["model"], "-o", str(out), "--quiet", *args]) == 2
    _assert_one_line(capsys, message)
    assert not out.exists() and list(tmp_path.iterdir()) == []


SERVE = [
    (["--max-batch", "x"], "--max-batch: invalid int value"),
    (["--max-batch", "1000"], "max_batch = 1000: allowed at most 256"),
    (["--frames", "-1"], "frames = -1: allowed an integer from 0"),
    (["--frames", "0"], "--frames 0: give a count of 1 or more \\(leave --frames out"),  # it ran for ever
    (["--duration", "soon"], "--duration: invalid float value"),
    (["--backend", "cuda"], "--backend: invalid choice: 'cuda'"),
    (["--memory", "shared"], "--memory: invalid choice: 'shared'"),
    (["--decoder", "vlc"], "--decoder: invalid choice: 'vlc'"),
    (["--postprocess", "fpga"], "--postprocess: invalid choice: 'fpga'"),
    (["--task", "segmentation"], "--task: invalid choice: 'segmentation'"),
    (["--task", "text-detection"], "task text-detection: the model's outputs do not fit: expects one output "
                                   "\\[N, 1, H, W\\]"),
    (["--metrics", "notaport"], "metrics listen = 'notaport': write HOST:PORT"),
    (["--metrics", "127.0.0.1:99999"], "metrics listen = '127.0.0.1:99999': write HOST:PORT"),
    (["--sink", "ftp://x"], "sink 'ftp://x': use jsonl:PATH\\[\\?append=1\\], stdout, mqtt://HOST:PORT/TOPIC, "
     "kafka://HOST:PORT/TOPIC"),
    (["--sink", "kafka://127.0.0.1:9092/"], "flags: sink kafka://127.0.0.1:9092/: the topic '': name one"),
    (["--sink", "redis://127.0.0.1?maxlen=x"], "sink redis://127.0.0.1\\?maxlen=x: maxlen='x'"),
    (["--sink", "jsonl:/proc/jetpipe-results.jsonl"], "sink jsonl:/proc/jetpipe-results.jsonl: cannot create "
     "/proc/jetpipe-results.jsonl"),
    (["--source", "webcam://0"], "unknown scheme 'webcam'"),
    (["--source", "synthetic://0x0@30/nv12"], "0x0: width and height from 2 to 16384"),
    (["--sink", "video:{tmp}/out.mp4?widht=320"], "unknown option 'widht'; this sink takes width, fps, codec, encoder"),
    (["--source", "{tmp}/missing.mp4"], "missing.mp4' not found"),
    (["--latency-budget-ms", "-1"], "latency_budget_ms = -1.0: allowed 0 \\(off\\) or milliseconds from 1.0 to 60000"),
    (["--latency-budget-ms", "0.001"], "latency_budget_ms = 0.001: allowed 0 \\(off\\) or milliseconds from 1.0"),
    (["--control"], "the control API is served by the metrics server, which is off"),
    (["--max-streams", "4"], "--max-streams is the control API's capacity: add --control"),
    (["--control", "--max-streams", "999"], "control max_streams = 999: from 0"),
    (["--control", "--metrics", "0.0.0.0:9108"], "needs a bearer token: set JETPIPE_CONTROL_TOKEN"),
    (["--control-allow", "gst"], "--control-allow and --control-folder say what the control API may start: add "
     "--control"),
    (["--control", "--metrics", "127.0.0.1:9", "--control-allow", "gstreamer"], "allow_schemes: 'gstreamer': "
     "choose from"),
    (["--control", "--metrics", "127.0.0.1:9", "--control-folder", "{tmp}/none"], "allow_folders: '.*none' is "
     "not a folder"),
    (["--metrics-host", "http://edge-7"], "metrics hosts: 'http://edge-7' is not a host name"),
    (["--summary", "{tmp}"], "--summary .*: .* exists: name a new file"),
    (["--summary", "{tmp}/none/s.json"], "--summary .*s.json: folder .*none does not exist"),
]


@pytest.mark.parametrize("args, message", SERVE)
def test_serve_flags(made, tmp_path, capsys, args, message):
    args = [a.format(tmp=tmp_path) for a in args]
    base = ["serve", "--bundle", made["bundle"], "--metrics", "", "--frames", "1"]
    if "--source" not in args:
        base += ["--source", "synthetic://64x48@0/nv12"]
    assert _run([*base, *args]) == 2
    _assert_one_line(capsys, message)
    assert list(tmp_path.iterdir()) == []


def test_serve_writes_its_summary_where_asked(made, tmp_path, capsys):
    base = ["serve", "--bundle", made["bundle"], "--metrics", "", "--frames", "2", "--source", "synthetic://64x48@0/nv12"]
    assert _run([*base, "--summary", str(tmp_path / "run.json")]) == 0
    assert json.loads((tmp_path / "run.json").read_text())["summary"]["processed"] == [2]
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left
    capsys.readouterr()
    assert _run([*base, "--summary", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["processed"] == [2]


def test_the_demos_errors_name_its_own_flag(tmp_path, capsys):
    pytest.importorskip("rapidocr_onnxruntime", reason="the demo's models need jetpipe[models]")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("a user's file")
    assert _run(["demo", "--bundle-dir", str(folder), "--duration", "1"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith("error: --bundle-dir ") and " -o " not in err, err
    assert last.endswith("choose another --bundle-dir")
    assert (folder / "notes.txt").read_text() == "a user's file"


CALIBRATE = [
    (["accuracy", "{bundle}", "--data", "synthetic", "--samples", "0"], "--samples 0 must be at least 1"),
    (["accuracy", "{bundle}", "--data", "synthetic", "--samples", "x"], "--samples: invalid int value"),
    (["accuracy", "{bundle}", "--data", "synthetic", "--provider", "tpu"], "--provider: invalid choice"),
    (["accuracy", "{bundle}", "--data", "synthetic", "--task", "classification", "--budget", "map>=0.9"],
     "task classification does not report map"),
    (["accuracy", "{bundle}", "--data", "synthetic", "--budget", "speed>=2"], "--budget metric 'speed'"),
    (["accuracy", "{bundle}"], "the following arguments are required: --data"),
    (["latency", "{bundle}", "--batch", "a,b"], "--batch 'a,b': comma-separated integers"),
    (["latency", "{bundle}", "--batch", "0"], "batch sizes must be >= 1"),
    (["latency", "{bundle}", "--batch", "4"], "--batch 4 exceeds the bundle's max batch 2"),
    (["latency", "{bundle}", "--iterations", "0"], "--iterations must be from 1 to 100000"),
    (["latency", "{bundle}", "--warmup", "-1"], "--warmup -1: from 0 to 100000 runs"),
    (["latency", "{bundle}", "--batch", "1", "--source", "rtsp://cam/1"], "latency runs use synthetic://"),
    (["latency", "{tmp}/nobundle"], "bundle .*nobundle not found"),
]


@pytest.mark.parametrize("args, message", CALIBRATE)
def test_calibrate_flags(made, tmp_path, capsys, args, message):
    args = [a.format(bundle=made["bundle"], tmp=tmp_path) for a in args]
    report = tmp_path / "report"
    extra = [] if "required" in message else ["--report", str(report)]
    assert _run(["calibrate", *args, *extra]) == 2
    _assert_one_line(capsys, message)
    assert not report.exists()


@pytest.mark.parametrize("argv, message", [
    (["demo", "--duration", "0"], "'0': give a number of seconds above 0"),
    (["demo", "--duration", "-3"], "'-3': give a number of seconds above 0"),
    (["inspect", "{tmp}/nothing"], "bundle .*nothing not found"),
    (["convert", "ppocr-dett", "-o", "{tmp}/o"], "did you mean the built-in 'ppocr-det'"),
    (["launch"], "invalid choice: 'launch'"),
])
def test_other_commands(tmp_path, capsys, argv, message):
    assert _run([a.format(tmp=tmp_path) for a in argv]) == 2
    _assert_one_line(capsys, message)
    assert list(tmp_path.iterdir()) == []


def test_every_option_has_help_and_says_its_default():
    for parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{parser.prog} {action.option_strings or action.dest} has no help"
    text = next(p for p in parsers(build_parser()) if p.prog == "jetpipe convert").format_help()
    assert "(default: fp32)" in text and "(default: 8)" in text


def test_inspect_json_is_json_alone(made, capsys):
    assert main(["inspect", made["bundle"], "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["format"] == 2 and "files verified" in out.err


def test_inspect_json_into_a_closed_pipe_is_quiet(made):
    import subprocess
    import sys

    done = subprocess.run(f"{sys.executable} -m jetpipe.cli inspect {made['bundle']} --json | head -1",
                          shell=True, capture_output=True, text=True)
    assert done.stdout.strip() == "{" and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def _assert_one_line(capsys, message):
    import re

    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith(("INFO:", "WARNING:"))]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(message, lines[0]), lines[0]


def test_per_stream_fps_is_a_rate_over_time_not_over_one_batch():
    from jetpipe.pipelines.counters import StreamCounters

    metrics = StreamCounters(streams=2)
    for _ in range(16):  # one batch delivers 16 results of stream 0 at one instant
        metrics.record_result(0, {"total": 1.0})
    assert metrics.fps(0) <= 16.0 and metrics.fps(1) == 0.0


def test_each_reason_and_warning_is_said_once(made, tmp_path, caplog):
    from jetpipe.runtime.open import open_runtime
    from jetpipe.synth import write_text_images

    with open_runtime(made["bundle"]):
        pass
    reasons = [r.getMessage() for r in caplog.records if "PyCUDA" in r.getMessage()]
    assert len(reasons) <= 1, reasons  # where PyCUDA is installed there is no reason to give
    images = write_text_images(tmp_path / "imgs", 3, size_hw=(48, 64))
    (images / "broken.png").write_bytes(b"not a png")
    caplog.clear()
    assert main(["convert", made["model"], "-o", str(tmp_path / "b"), "--precision", "int8", "--calib", str(images),
                 "--quiet"]) == 0
    assert sum("skipping unreadable calibration image" in r.getMessage() for r in caplog.records) == 1


def test_other_libraries_info_lines_stay_quiet(made, capsys):
    """matplotlib's 'categorical units' lines, onnxslim's and PyNvVideoCodec's INFO: not at default verbosity."""
    import logging

    assert main(["inspect", made["bundle"]]) == 0
    for name in ("matplotlib", "onnxslim", "PyNvVideoCodec"):
        assert logging.getLogger(name).getEffectiveLevel() >= logging.WARNING, name


def test_serve_help_names_the_video_sinks_encoder_choice():
    text = next(p for p in parsers(build_parser()) if p.prog == "jetpipe serve").format_help()
    assert "encoder=E" in text and "gst:ELEMENT" in text and "nvv4l2h264enc" in text


def test_a_metrics_port_in_use_is_one_line(made, capsys):
    """A second daemon on the same port (the default 9108): one line naming the address, not a traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = _run(["serve", "--bundle", made["bundle"], "--source", "synthetic://64x48@0/nv12", "--frames", "1",
                     "--metrics", f"127.0.0.1:{port}"])
    assert code == 2
    _assert_one_line(capsys, f"metrics listen = '127.0.0.1:{port}': cannot listen there \\(Address already in use\\)")


def test_calibrate_latency_help_and_errors_say_one_syntax(made, tmp_path, capsys):
    """Issue 49: the help said synthetic[:WxH:FORMAT], the error synthetic://WxH/FORMAT."""
    with pytest.raises(SystemExit):
        main(["calibrate", "latency", "--help"])
    assert "synthetic://WxH/FORMAT" in capsys.readouterr().out
    assert _run(["calibrate", "latency", made["bundle"], "--batch", "1", "--source", "webcam", "--report",
                 str(tmp_path / "r")]) == 2
    _assert_one_line(capsys, "latency runs use synthetic://WxH/FORMAT frames")
