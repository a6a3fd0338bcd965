"""Nothing lost: bundles and reports replace only what jetpipe wrote; signals; stale staging; integrity."""

import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from jetpipe import bundle
from jetpipe.cli import main
from jetpipe.synth import write_text_images
from tests.helpers import residual_cnn, save


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outputs")
    model = save(residual_cnn(batch=1), folder / "tiny.onnx")
    images = write_text_images(folder / "imgs", 4, size_hw=(48, 64))
    return folder, model, images


@pytest.fixture
def fresh_bundle(made, tmp_path):
    _, model, _ = made
    out = tmp_path / "b"
    assert main(["convert", model, "-o", str(out), "--max-batch", "2", "--quiet"]) == 0
    return out


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


def _accuracy(bundle_dir, images, report, *extra):
    return main(["calibrate", "accuracy", str(bundle_dir), "--data", str(images), "--task", "classification",
                 "--samples", "2", "--report", str(report), *extra])


def _latency(bundle_dir, report, *extra):
    return main(["calibrate", "latency", str(bundle_dir), "--batch", "1", "--iterations", "2", "--warmup", "1",
                 "--source", "synthetic:64x48:nv12", "--report", str(report), *extra])


# --- reports -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("run", ["accuracy", "latency"])
def test_report_never_replaces_a_users_folder(made, fresh_bundle, tmp_path, capsys, run):
    _, _, images, = made
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("precious")
    for extra in ([], ["--force"]):
        code = _accuracy(fresh_bundle, images, folder, *extra) if run == "accuracy" else \
            _latency(fresh_bundle, folder, *extra)
        assert code == 2
        assert "is not a report" in _one_line_error(capsys)
    assert (folder / "notes.txt").read_text() == "precious" and len(list(folder.iterdir())) == 1


def test_report_never_replaces_the_bundle_or_the_current_folder(made, fresh_bundle, tmp_path, capsys, monkeypatch):
    _, _, images = made
    before = {p.name: p.read_bytes() for p in fresh_bundle.iterdir()}
    for target in (fresh_bundle, fresh_bundle / "report", tmp_path):
        assert _accuracy(fresh_bundle, images, target, "--force") == 2
        assert "overlaps" in _one_line_error(capsys)
    monkeypatch.chdir(tmp_path / "b")
    assert _latency(fresh_bundle, ".", "--force") == 2
    assert "is the current folder" in _one_line_error(capsys)
    assert {p.name: p.read_bytes() for p in fresh_bundle.iterdir()} == before


def test_an_existing_report_is_replaced_only_with_force(made, fresh_bundle, tmp_path, capsys):
    _, _, images = made
    report = tmp_path / "report"
    assert _latency(fresh_bundle, report) == 0
    first = json.loads((report / "report.json").read_text())
    capsys.readouterr()
    assert _latency(fresh_bundle, report) == 2
    assert "already exists: pass --force" in _one_line_error(capsys)
    assert _accuracy(fresh_bundle, images, report, "--force") == 0
    assert json.loads((report / "report.json").read_text())["task"] == "classification" != first.get("task")
    (report / "extra.csv").write_text("user data")
    assert _accuracy(fresh_bundle, images, report, "--force") == 2
    assert "other files in it (extra.csv)" in _one_line_error(capsys)
    assert (report / "extra.csv").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _latency(fresh_bundle, empty) == 0  # an empty folder holds nothing to lose


def test_report_folder_writability_is_checked_before_measuring(made, fresh_bundle, tmp_path, capsys, monkeypatch):
    from jetpipe.calibration import accuracy

    _, _, images = made
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK) and os.getuid() == 0:  # root ignores modes: make the probe fail instead
        monkeypatch.setattr("tempfile.mkstemp", _read_only_fs)
    measured = []
    monkeypatch.setattr(accuracy, "prepare_context", lambda opts: measured.append(1))
    try:
        assert _accuracy(fresh_bundle, images, locked / "report") == 2
    finally:
        locked.chmod(0o700)
    assert "cannot write in" in _one_line_error(capsys) and not measured


def _read_only_fs(*args, **kwargs):
    raise OSError(30, "Read-only file system")


# --- bundles -------------------------------------------------------------------------------------------------

def test_force_replaces_only_a_bundle(made, fresh_bundle, tmp_path, capsys):
    _, model, _ = made
    users = tmp_path / "users"
    users.mkdir()
    (users / "photo.jpg").write_bytes(b"jpeg")
    assert main(["convert", model, "-o", str(users), "--force", "--quiet"]) == 2
    assert "is not a bundle: --force replaces only a bundle" in _one_line_error(capsys)
    assert (users / "photo.jpg").read_bytes() == b"jpeg"
    (fresh_bundle / "notes.txt").write_text("mine")
    assert main(["convert", model, "-o", str(fresh_bundle), "--force", "--quiet"]) == 2
    assert "other files in it (notes.txt)" in _one_line_error(capsys)
    (fresh_bundle / "notes.txt").unlink()
    assert main(["convert", model, "-o", str(fresh_bundle), "--force", "--quiet"]) == 0


def test_output_writability_is_checked_before_any_work(made, tmp_path, capsys, monkeypatch):
    from jetpipe.convert import chain

    _, model, images = made
    monkeypatch.setattr("tempfile.mkstemp", _read_only_fs)
    calls = []
    monkeypatch.setattr(chain, "prepare", lambda opts: calls.append(1))
    assert main(["convert", model, "-o", str(tmp_path / "b"), "--precision", "int8", "--calib", str(images),
                 "--quiet"]) == 2
    assert "cannot write in" in _one_line_error(capsys) and not calls


def test_sigterm_while_the_bundle_is_staged_leaves_nothing(made, no_tmp_leftovers, capsys):
    """On a Jetson the engine build runs inside the staging window for minutes: SIGTERM there is Ctrl-C."""
    _, model, _ = made

    class TermOnEngineStep(logging.Handler):
        def emit(self, record):
            if "without an engine" in record.getMessage():
                os.kill(os.getpid(), signal.SIGTERM)

    handler = TermOnEngineStep()
    logging.getLogger("jetpipe").addHandler(handler)
    before = signal.getsignal(signal.SIGTERM)
    try:
        out = no_tmp_leftovers / "b"
        assert main(["convert", model, "-o", str(out), "--quiet"]) == 143
    finally:
        logging.getLogger("jetpipe").removeHandler(handler)
    assert "interrupted (SIGTERM): nothing was written" in capsys.readouterr().err
    assert not out.exists() and signal.getsignal(signal.SIGTERM) is before


def test_sigterm_of_a_convert_process_exits_143_with_a_message(made, tmp_path):
    _, model, images = made
    out = tmp_path / "b"
    code = ("import os, signal, jetpipe.convert.chain as p, jetpipe.cli as c\n"
            "real = p._calibrate\n"
            "def term(*a, **k):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return real(*a, **k)\n"
            "p._calibrate = term\n"
            f"raise SystemExit(c.main(['convert', {model!r}, '-o', {str(out)!r}, '--precision', 'fp16', "
            f"'--calib', {str(images)!r}, '--quiet']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, done.stderr
    assert "interrupted (SIGTERM)" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_stale_staging_folders_are_cleaned_and_an_old_bundle_restored(made, fresh_bundle, tmp_path):
    _, model, _ = made
    dead = _dead_pid()
    stale_tmp = tmp_path / f".b.tmp-{dead}-abc123"
    stale_tmp.mkdir()
    (stale_tmp / "model.onnx").write_bytes(b"half")
    # a run killed between moving the old bundle aside and moving the new one in
    os.replace(fresh_bundle, tmp_path / f".b.old-{dead}")
    other = tmp_path / ".other.tmp-1-x"  # another output's staging: not ours to touch
    other.mkdir()
    assert main(["convert", model, "-o", str(tmp_path / "b2"), "--quiet"]) == 0
    assert stale_tmp.exists()  # only staging folders of the output being written are cleaned
    assert main(["convert", model, "-o", str(fresh_bundle), "--force", "--quiet"]) == 0
    assert not stale_tmp.exists() and not (tmp_path / f".b.old-{dead}").exists() and other.exists()
    assert bundle.load(fresh_bundle)["format"] == bundle.FORMAT_VERSION


def test_staging_of_a_live_run_is_left_alone(tmp_path):
    from jetpipe import output_folders

    live = tmp_path / f".b.tmp-{os.getppid()}-zz"
    live.mkdir()
    output_folders.clean_stale(tmp_path / "b")
    assert live.exists()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# --- integrity -----------------------------------------------------------------------------------------------

def _edit_manifest(folder, change):
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(files={}), "digest does not match"),
    (lambda m: m["preprocess"].update(mean=[0.5, 0.5, 0.5]), "digest does not match"),
    (lambda m: m.pop("manifest_sha256"), "digest does not match"),
])
def test_an_edited_manifest_is_refused_by_every_command(made, fresh_bundle, tmp_path, capsys, change, message):
    _, _, images = made
    _edit_manifest(fresh_bundle, change)
    assert main(["inspect", str(fresh_bundle)]) == 2
    assert message in _one_line_error(capsys)
    assert main(["serve", "--bundle", str(fresh_bundle), "--source", "synthetic:64x48@30:nv12", "--frames", "1",
                 "--metrics", "", "--backend", "onnxruntime-cpu"]) == 2
    assert message in _one_line_error(capsys)
    assert _accuracy(fresh_bundle, images, tmp_path / "r") == 2
    assert message in _one_line_error(capsys)
    assert _latency(fresh_bundle, tmp_path / "r") == 2
    assert message in _one_line_error(capsys)


def test_a_manifest_that_stops_listing_a_file_fails_verification(fresh_bundle, capsys):
    manifest = json.loads((fresh_bundle / "manifest.json").read_text())
    manifest["files"] = {}
    del manifest["manifest_sha256"]
    manifest["manifest_sha256"] = bundle._digest(manifest)  # re-digested by hand: the files are still required
    (fresh_bundle / "manifest.json").write_text(json.dumps(manifest))
    assert bundle.verify(fresh_bundle) == ["model.onnx: not listed in the manifest"]
    assert main(["inspect", str(fresh_bundle)]) == 1
    assert "model.onnx: not listed in the manifest" in capsys.readouterr().err


def test_a_swapped_model_is_refused_before_loading(made, fresh_bundle, capsys):
    from jetpipe.runtime.open import open_runtime

    _, model, _ = made
    (fresh_bundle / "model.onnx").write_bytes(open(model, "rb").read())
    with pytest.raises(bundle.BundleError, match="model.onnx: sha256 differs"):
        open_runtime(fresh_bundle, backend="onnxruntime-cpu")


def test_two_converts_to_one_output_at_once_cannot_both_write_it(made, tmp_path):
    """Started together: one writes the bundle, the other is refused (being written, or already there); neither
    replaces the other's bundle unasked. Before the lock both said done and one bundle silently won."""
    _, model, images = made
    out = tmp_path / "b"
    command = [sys.executable, "-m", "jetpipe", "convert", model, "-o", str(out), "--max-batch", "2",
               "--precision", "fp16", "--calib", str(images), "--quiet"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "is being written by another jetpipe run" in refused or "already exists" in refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no lock or staging folder left


_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("held", flush=True)
time.sleep(120)
"""


def test_a_lock_of_a_live_run_refuses_and_a_dead_runs_lock_is_taken_over(made, tmp_path, capsys):
    _, model, _ = made
    out, lock = tmp_path / "b", tmp_path / ".b.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["convert", model, "-o", str(out), "--max-batch", "2", "--quiet"]) == 2
        assert f"is being written by another jetpipe run (pid {holder.pid})" in _one_line_error(capsys)
        assert not out.exists() and lock.read_text() == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert lock.read_text() == str(holder.pid)  # its file stays; the kernel dropped its lock with it
    assert main(["convert", model, "-o", str(out), "--max-batch", "2", "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


_CLAIM = """
import sys
from pathlib import Path
from jetpipe import output_folders
from jetpipe.errors import JetpipeError
print("ready", flush=True)
sys.stdin.readline()  # all three claim together, once every one is ready
try:
    output_folders.claim(Path(sys.argv[1]), "-o")
    print("won", flush=True)
except JetpipeError:
    print("lost", flush=True)
sys.stdin.read()  # the winner holds its claim until the test has heard from every run
"""


def test_runs_claiming_one_output_together_have_one_winner(tmp_path):
    """Three runs claim at once, five times over: exactly one holds it each time. The lock made by O_EXCL and
    then filled with the pid let a run read it empty, take it for a dead run's and remove it (two winners in
    23 of 30 tries here)."""
    for attempt in range(5):
        out = tmp_path / f"b{attempt}"
        runs = [subprocess.Popen([sys.executable, "-c", _CLAIM, str(out)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for _ in range(3)]
        assert [run.stdout.readline().strip() for run in runs] == ["ready"] * 3
        for run in runs:
            run.stdin.write("go\n")
            run.stdin.flush()
        said = sorted(run.stdout.readline().strip() for run in runs)
        for run in runs:
            run.communicate("")
        assert said == ["lost", "lost", "won"], attempt
    assert not list(tmp_path.glob(".*.lock"))  # the winners released theirs on exit


def test_an_output_given_as_a_link_is_written_where_it_points(made, tmp_path):
    _, model, _ = made
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real, target_is_directory=True)
    for extra in ([], ["--force"]):
        assert main(["convert", model, "-o", str(link), "--max-batch", "2", "--quiet", *extra]) == 0
        assert link.is_symlink() and (real / "manifest.json").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # nothing left beside them


@pytest.mark.parametrize("what", ["convert", "report", "video", "jpeg"])
def test_a_name_too_long_for_the_file_system_is_one_line(made, fresh_bundle, tmp_path, capsys, what):
    """A 300-byte name (most file systems take 255) was a traceback wherever it was written."""
    _, model, images = made
    long = tmp_path / ("x" * 300)
    serve = ["serve", "--bundle", str(fresh_bundle), "--source", "synthetic:64x48", "--frames", "2", "--metrics", ""]
    command = {"convert": ["convert", model, "-o", str(long), "--max-batch", "2", "--quiet"],
               "report": ["calibrate", "accuracy", str(fresh_bundle), "--data", str(images), "--report", str(long)],
               "video": [*serve, "--sink", f"video:{long}.mp4"],
               "jpeg": [*serve, "--sink", f"jpeg:{long}"]}[what]
    assert main(command) == 2
    assert "names here hold at most" in _one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_a_full_disk_is_one_line_and_leaves_nothing(made, tmp_path, capsys):
    """ENOSPC while writing the bundle (4 KB left on a 16 KB tmpfs) was a traceback; the staging folder is
    removed."""
    from tests.helpers import nearly_full_disk

    _, model, _ = made
    with nearly_full_disk(tmp_path / "small", 16, free_kb=4) as small:  # less than the model
        assert main(["convert", model, "-o", str(small / "b"), "--max-batch", "2", "--quiet"]) == 2
        assert "No space left on device" in _one_line_error(capsys)
        assert sorted(p.name for p in small.iterdir()) == ["filler"]
