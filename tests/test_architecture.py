"""The import graph keeps the design's layers: no circles, no import back up, CUDA only in runtime."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jetpipe"
# lower layers first; an import may only point at its own layer or a lower one
LAYERS = {"base": 0, "runtime": 1, "tasks": 2, "convert": 3, "export": 3, "pipelines": 4, "calibration": 5,
          "top": 6}
TOP = {"jetpipe.cli", "jetpipe.cli_values", "jetpipe.doctor", "jetpipe.__main__"}
GPU_PACKAGES = {"pycuda", "tensorrt", "tensorrt_rtx", "PyNvVideoCodec", "cupy"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(tree) -> list[tuple[ast.AST, str]]:
    """(node, imported module) for every import in the tree, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found += [(node, f"{node.module}.{alias.name}") for alias in node.names]
            found.append((node, node.module))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for _, target in _imports(ast.parse(path.read_text())):
            # a submodule importing its own package's __init__ is how Python loads packages, not a circle
            if target in modules and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def _layer(module: str) -> str:
    if module in TOP:
        return "top"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or parts[-1] in LAYERS else "base"


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_circle():
    assert _cycles(_graph()) == []


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_layer_imports_a_higher_one():
    upward = [f"{module} ({_layer(module)}) -> {target} ({_layer(target)})"
              for module, targets in _graph().items() for target in targets
              if LAYERS[_layer(target)] > LAYERS[_layer(module)]]
    assert upward == []


def test_own_modules_are_imported_at_the_top():
    """Function-level imports are for optional third-party packages only (GPU stacks, plotting)."""
    late = []
    for name, path in _modules().items():
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                late += [f"{name}:{node.lineno} {target}" for node, target in _imports(function)
                         if target.split(".")[0] == "jetpipe"]
    assert late == []


def test_gpu_packages_are_used_only_under_runtime():
    outside = []
    for name, path in _modules().items():
        if _layer(name) == "runtime":
            continue
        source = path.read_text()
        outside += [f"{name}:{node.lineno} {target}" for node, target in _imports(ast.parse(source))
                    if target.split(".")[0] in GPU_PACKAGES]
        if "CUDAExecutionProvider" in source:
            outside.append(f"{name}: names ONNX Runtime's CUDA provider")
    assert outside == []


def test_the_cli_starts_without_loading_opencv_or_a_gpu_stack():
    """Own modules are imported at the top, so heavy third-party packages must be lazy."""
    code = ("import sys, jetpipe.cli, jetpipe.runtime.open\n"
            "print(sorted(m for m in ('cv2', 'onnxruntime', 'pycuda', 'tensorrt', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- the daemon's rooms (issue 50): small classes, the daemon as wiring, no reaching into another's privates ---

MAX_CLASS_LINES, MAX_CLASS_METHODS, MAX_DAEMON_LINES = 300, 25, 450
# a third-party object's private names, each with why: argparse offers no public way to list its subcommands;
# os._exit is public (its name is the C library's), the worker's way out past the interpreter's shutdown
THIRD_PARTY_PRIVATE = {("jetpipe.cli", "parser._actions"), ("jetpipe.cli", "argparse._SubParsersAction"),
                       ("jetpipe.pipelines.service.closing", "os._exit")}


def test_no_class_of_the_pipelines_holds_a_whole_daemon():
    big = []
    for name, path in _modules().items():
        if not name.startswith("jetpipe.pipelines"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                methods = sum(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) for m in node.body)
                if lines > MAX_CLASS_LINES or methods > MAX_CLASS_METHODS:
                    big.append(f"{name}.{node.name}: {lines} lines, {methods} methods")
    assert big == []
    daemon = PACKAGE / "pipelines" / "service" / "daemon.py"
    assert len(daemon.read_text().splitlines()) <= MAX_DAEMON_LINES


def test_no_module_outside_runtime_reaches_into_private_names():
    """`other._name` (any object but self, cls or super()) and `from jetpipe.x import _name`: a module uses the
    public seams of another. runtime/ is the CUDA layer and may."""
    reaching = []
    for name, path in _modules().items():
        if name.startswith("jetpipe.runtime"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jetpipe"):
                reaching += [f"{name}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                             if _private(a.name)]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
                if (name, ast.unparse(node)) not in THIRD_PARTY_PRIVATE:
                    reaching.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert reaching == []


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def _own(value: ast.AST) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


# (module, attribute) probed where what is probed is not ours: PyAV's releases differ, os differs by platform
FOREIGN_PROBES = {("jetpipe.pipelines.ingest.sources.pyav", "is_corrupt"),
                  ("jetpipe.pipelines.service.daemon", "sched_getaffinity"), ("jetpipe.pipelines.service.daemon", "id")}


def test_the_pipelines_ask_their_parts_through_declared_protocols_not_by_probing():
    """hasattr(x, "name") and getattr(x, "name", default) in the pipelines: what a source, sink, runtime or record
    has is declared (sources/base.py, sinks/base.py, runtime/api.py, record.py), never guessed at (issue 50)."""
    probes = []
    for name, path in _modules().items():
        if not name.startswith("jetpipe.pipelines"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
                continue
            probing = node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3)
            attribute = node.args[1]
            if probing and isinstance(attribute, ast.Constant) and (name, attribute.value) not in FOREIGN_PROBES:
                probes.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert probes == []


# the keys of a frame's results that are the typed record's arrays (tasks.detections.Detections)
RESULT_KEYS = {"boxes", "scores", "classes", "labels", "track_ids"}
# modules of the pipelines that may read results by key: the sinks (JSON is made there), the configuration's
# TOML tables (a [[secondary]]'s "classes" is no result)
KEYED_READS_ALLOWED = ("jetpipe.pipelines.outputs.sinks", "jetpipe.pipelines.config")


def test_the_pipelines_read_a_frames_results_as_arrays_not_by_key():
    """results["boxes"], .get("track_ids"): 20 such reads sat in the pipelines (secondary, annotate, events,
    record, steps, ...), each converting lists again (issue 64). The pipelines read the typed record's arrays;
    JSON's keys are the sinks' business."""
    reads = []
    for name, path in _modules().items():
        if not name.startswith("jetpipe.pipelines") or name.startswith(KEYED_READS_ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key = node.slice.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "get", "setdefault") and node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
            if key in RESULT_KEYS:
                reads.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert reads == []


# the rooms of the pipelines in the order a frame goes through them: a room imports its own and earlier rooms only
ROOMS = ("ingest", "core", "outputs", "service")
MAX_LOOSE = 10  # modules directly in pipelines/ (what every room shares: the configuration, the counters)


def test_the_pipelines_rooms_follow_the_way_a_frame_goes():
    """pipelines/ is grouped by stage, ingest -> core -> outputs -> service (issue 64): a room never imports a later
    one, and few modules lie loose beside the rooms (26 did)."""
    back = []
    for name, imported in _graph().items():
        room = _room(name)
        if room is None:
            continue
        for target in imported:
            other = _room(target)
            if other is not None and ROOMS.index(other) > ROOMS.index(room):
                back.append(f"{name} -> {target}")
    assert back == []
    loose = [p.name for p in (PACKAGE / "pipelines").glob("*.py") if p.name != "__init__.py"]
    assert len(loose) <= MAX_LOOSE, loose


def test_the_pipelines_tests_mirror_the_rooms():
    """A test of a room's module lies in that room's folder under tests/pipelines; only the loose modules'
    tests lie loose."""
    tests = PACKAGE.parent / "tests" / "pipelines"
    assert sorted(p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ROOMS)
    loose_modules = {p.stem for p in (PACKAGE / "pipelines").glob("*.py")}
    stray = [p.name for p in tests.glob("test_*.py") if p.stem.removeprefix("test_") not in loose_modules]
    assert stray == []


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["jetpipe", "pipelines"] and parts[2] in ROOMS else None


MAX_CLASS_LINES, MAX_CLASS_METHODS = 300, 25
MAX_CONSTRUCTOR_PARAMETERS = 8  # beyond it, a small config object (GpuOptions, FrameParts, YoloNms)


def test_no_class_is_a_god_object():
    """GpuRuntime was 480 lines and 36 methods (issue 64): a class stays under 300 lines and 25 methods of its
    own, and a constructor takes at most 8 parameters."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            methods = [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if lines > MAX_CLASS_LINES or len(methods) > MAX_CLASS_METHODS:
                found.append(f"{name}.{node.name}: {lines} lines, {len(methods)} methods")
            for init in (f for f in methods if f.name == "__init__"):
                given = [a.arg for a in init.args.posonlyargs + init.args.args + init.args.kwonlyargs][1:]
                if len(given) > MAX_CONSTRUCTOR_PARAMETERS:
                    found.append(f"{name}.{node.name}.__init__: {len(given)} parameters")
    assert found == []
