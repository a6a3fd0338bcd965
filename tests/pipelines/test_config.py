"""Config traps: booleans are booleans, tables vs arrays of tables, required keys (no tracebacks)."""

import re

import pytest

from jetpipe.pipelines.config import ConfigError, PipelineConfig, SourceConfig, load, validate

HEAD = "[pipeline]\nbundle = 'b'\n"


@pytest.mark.parametrize("text, message", [
    (HEAD + "[[source]]\nuri = 'a.mp4'\nloop = 'no'\n", r"loop = 'no': expected true or false"),
    (HEAD + "[[source]]\nuri = 'a.mp4'\nrealtime = 1\n", r"realtime = 1: expected true or false"),
    (HEAD + "[[source]]\nuri = 'a.mp4'\nmoving_camera = 1\n", r"moving_camera = 1: expected true or false"),
    (HEAD + "tracker = 'bytetrack'\n[[source]]\nuri = 'a.mp4'\nmoving_camera = true\n",
     r"moving_camera = true moves its tracks with the camera, which botsort does \(tracker = 'bytetrack'\)"),
    (HEAD + "[[source]]\nuri = 'a.mp4'\nmoving_camera = true\n", r"set tracker = \"botsort\""),
    (HEAD + "[[source]]\nuri = 7\n", r"uri = 7: expected a string"),
    (HEAD + "[[source]]\nuri = 'a.mp4'\ndecoder = 'nvidia'\n", r"decoder = 'nvidia': allowed auto \| nvdec \| ffmpeg"),
    (HEAD + "[[source]]\nuri = 'a.mp4'\nhwaccel = 'cuda --x'\n", r"hwaccel = 'cuda --x': an FFmpeg hardware device"),
    (HEAD + "postprocess = 'fpga'\n[[source]]\nuri = 'synthetic'\n",
     r"postprocess = 'fpga': allowed auto \| gpu \| cpu"),
    (HEAD + "[source]\nuri = 'synthetic'\n", r"\[source\] is one table; write \[\[source\]\]"),
    (HEAD + "[[source]]\nuri = 'synthetic'\n[sink]\nuri = 'stdout'\n", r"\[sink\] is one table; write \[\[sink\]\]"),
    (HEAD + "[[source]]\nuri = 'synthetic'\n[[sink]]\n", r"\[\[sink\]\] #1: uri is required"),
    (HEAD + "max_batch = true\n[[source]]\nuri = 'synthetic'\n", r"max_batch = True: expected an integer"),
    (HEAD + "max_frame_hw = ['a', 'b']\n[[source]]\nuri = 'synthetic'\n",
     r"max_frame_hw = \('a', 'b'\): allowed \[height, width\], two integers"),
    (HEAD + "[[source]]\nuri = 'synthetic'\n[metrics]\nlisten = 'notaport'\n", r"listen = 'notaport': write HOST:PORT"),
    (HEAD + "[[source]]\nuri = 'synthetic'\n[metrics]\nlisten = ':99999'\n", r"listen = ':99999': write HOST:PORT"),
    (HEAD + "decode_processes = 33\n[[source]]\nuri = 'synthetic'\n",
     r"decode_processes = 33: allowed auto \(where they pay\) or an integer from 0 \(decode in the serving "
     r"process\) to 32"),
    (HEAD + "decode_processes = 1.5\n[[source]]\nuri = 'synthetic'\n",
     r"decode_processes = 1.5: expected an integer or a string"),
    (HEAD + "decode_threads = 33\n[[source]]\nuri = 'synthetic'\n",
     r"decode_threads = 33: allowed an integer from 0 \(auto: a thread a stream, 4 at most\) to 32"),
    (HEAD + "decode_threads = -1\n[[source]]\nuri = 'synthetic'\n", r"decode_threads = -1: allowed an integer"),
    (HEAD + "decode_processes = 0\ndecode_threads = 8\n[[source]]\nuri = 'synthetic'\n", r"decode_threads = 8 sets "
     r"the threads of decode processes, and there are none: add decode_processes = N"),
])
def test_config_traps_are_named(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load(path)


def test_source_options_are_read(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(HEAD + "[[source]]\nuri = 'a.mp4'\nloop = true\nrealtime = true\ndecoder = 'ffmpeg'\n"
                    "hwaccel = 'qsv'\n")
    source = load(path).sources[0]
    assert (source.uri, source.loop, source.realtime, source.decoder, source.hwaccel) == \
        ("a.mp4", True, True, "ffmpeg", "qsv")


def test_queue_depth_and_ring_memory_are_bounded_before_anything_is_allocated(tmp_path, monkeypatch, capsys):
    """queue_depth = 100000000 took 19 GB and then the OOM killer; now a bound, and the rings' memory is
    checked against what the machine has before any ring is allocated."""
    from jetpipe.cli import main
    from jetpipe.pipelines.ingest import rings
    from tests.helpers import residual_cnn, save

    model = save(residual_cnn(batch=1), tmp_path / "m.onnx")
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--max-batch", "2", "--quiet"]) == 0
    config = tmp_path / "c.toml"
    config.write_text(f'[pipeline]\nbundle = "{tmp_path / "b"}"\nqueue_depth = 100000000\n'
                      '[[source]]\nuri = "synthetic"\n')
    assert main(["serve", str(config), "--frames", "1", "--metrics", ""]) == 2
    assert "queue_depth = 100000000: allowed an integer from 1 to 1024" in capsys.readouterr().err
    monkeypatch.setattr(rings, "available_memory", lambda: 64 * 2**20)  # a machine with 64 MiB free
    assert main(["serve", "--bundle", str(tmp_path / "b"), "--source", "synthetic://1920x1080@30/bgr", "--frames",
                 "1", "--metrics", ""]) == 2
    err = capsys.readouterr().err
    assert "the frame rings would take 83 MiB (1 stream(s) x 6 slots: queue_depth + 2, and 8 shared" in err
    assert "Traceback" not in err
    assert "more than 80 % of the 64 MiB available" in err


def test_a_config_that_is_not_utf8_is_one_line(tmp_path, capsys):
    from jetpipe.cli import main

    config = tmp_path / "latin1.toml"
    config.write_bytes('[pipeline]\nbundle = "café"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml is not UTF-8 text \(byte 0xe9 at offset 24\): TOML files"):
        load(config)
    assert main(["serve", str(config)]) == 2
    err = capsys.readouterr().err
    assert "is not UTF-8 text" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_toml_mistakes_are_named_for_what_they_are(tmp_path):
    """Issue 49: a source written as a key said "unknown key 's'" (the string read as a table), a folder given
    as the config said "not found", and a byte-order mark (Windows editors) made the file invalid TOML."""
    as_key = tmp_path / "key.toml"
    as_key.write_text('source = "synthetic"\n[pipeline]\nbundle = "det"\n')
    with pytest.raises(ConfigError, match=r"source = 'synthetic' is not a table: write each source as a \[\[source"):
        load(as_key)
    folder = tmp_path / "configs"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"configs is a folder: name the TOML file"):
        load(folder)
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b'\xef\xbb\xbf[pipeline]\nbundle = "det"\n[[source]]\nuri = "synthetic"\n')
    assert [s.uri for s in load(bom).sources] == ["synthetic"]


def test_decode_threads_are_read_and_size_each_decode_process():
    from jetpipe.pipelines.ingest.decode_procs import decoding_threads

    assert decoding_threads(64, 1) == 4 and decoding_threads(6, 2) == 3   # default: a thread a stream, 4 at most
    assert decoding_threads(64, 1, asked=8) == 8 and decoding_threads(3, 1, asked=8) == 8


def test_decode_threads_from_toml_and_cli(tmp_path):
    from jetpipe.cli import _serve_config, build_parser

    path = tmp_path / "c.toml"
    path.write_text(HEAD + "decode_processes = 1\ndecode_threads = 8\n[[source]]\nuri = 'a.mp4'\n")
    assert load(path).decode_threads == 8
    args = build_parser().parse_args(["serve", str(path), "--decode-threads", "4"])
    assert _serve_config(args).decode_threads == 4


def test_a_config_file_completed_by_the_flags_is_checked_once_they_are_in(tmp_path):
    """A file of [pipeline] options alone: --bundle and --source complete it (before, the file was checked whole
    on its own: "no source: add a [[source]] uri (or --source)" with --source given); what is still missing is
    said in one line."""
    from jetpipe.cli import _serve_config, build_parser

    path = tmp_path / "c.toml"
    path.write_text("[pipeline]\nqueue_depth = 60\n")
    args = build_parser().parse_args(["serve", str(path), "--bundle", "b", "--source", "synthetic"])
    config = _serve_config(args)
    assert (config.queue_depth, str(config.bundle), [s.uri for s in config.sources]) == (60, "b", ["synthetic"])
    with pytest.raises(ConfigError, match="no source"):
        _serve_config(build_parser().parse_args(["serve", str(path), "--bundle", "b"]))
    with pytest.raises(ConfigError, match="bundle is required"):
        _serve_config(build_parser().parse_args(["serve", str(path), "--source", "synthetic"]))
    alone = tmp_path / "d.toml"
    alone.write_text(HEAD)
    with pytest.raises(ConfigError, match="no source"):
        load(alone)  # a file read on its own is checked whole


# -- values that parse but mean nothing (issue 63's held-out list): each refused in one line naming the key -------
@pytest.mark.parametrize("key, value", [
    ("batch_timeout_ms", float("inf")), ("batch_timeout_ms", 1e308), ("frames", 10**30), ("duration", float("inf")),
    ("reconnect_max_s", 0), ("reconnect_max_s", float("nan")), ("log_every_s", -1), ("stop_timeout_s", 1e9),
    ("queue_depth", 10**30), ("latency_budget_ms", float("nan")), ("model_instances", 0), ("model_instances", 5),
    ("model_instances", True),
])
def test_pipeline_values_beyond_any_meaning_are_refused(key, value):
    from pathlib import Path

    with pytest.raises(ConfigError, match=f"^config: {key} = .*: allowed "):
        validate(PipelineConfig(bundle=Path("b"), sources=[SourceConfig("synthetic")], **{key: value}))


@pytest.mark.parametrize("uri, said", [
    ("video:{d}/a.mp4?fps=inf", "fps='inf': give a number above 0, at most 1000"),
    ("video:{d}/a.mp4?fps=1e308", "at most 1000"),
    ("video:{d}/a.mp4?width=100000000", "width='100000000': give a number above 0, at most 8192"),
    ("video:{d}/a.txt", "name a video file ending in .mp4"),
    ("jpeg:{d}?quality=1000", "quality='1000': give a number above 0, at most 100"),
    ("jpeg:{d}?every=0", "every='0'"),
    ("redis://127.0.0.1:0", "the port is not a number from 1 to 65535"),
    ("mqtt://127.0.0.1:0/t", "the port is not a number from 1 to 65535"),
    ("http://127.0.0.1:0/hook", "the port is not a number from 1 to 65535"),
    ("rtsp://127.0.0.1:0/cam", "the port is not a number from 1 to 65535"),
])
def test_sink_values_beyond_any_meaning_are_refused(uri, said, tmp_path):
    from jetpipe.errors import JetpipeError
    from jetpipe.pipelines.outputs.sinks import open_sink

    with pytest.raises(JetpipeError, match=re.escape(said)):
        open_sink(uri.format(d=tmp_path)).close()
    assert list(tmp_path.iterdir()) == []  # nothing written
