"""The Python API a program embeds: docs/serve.md's example, run as written (the bundle's path aside), and a loop
left early stops the pipeline."""

import re
from pathlib import Path

import jetpipe

DOC = Path(__file__).resolve().parents[3] / "docs" / "serve.md"


def _example() -> str:
    text = DOC.read_text()
    marker = text.index("<!-- the example the tests run: tests/pipelines/service/test_embed.py -->")
    return re.search(r"```python\n(.*?)```", text[marker:], re.S).group(1)


def test_the_documented_loop_runs_as_written(det_bundle, capsys):
    exec(compile(_example().replace("bundles/det-fp16", str(det_bundle)), "serve.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    frames = [int(line.split()[1]) for line in lines]  # stream, frame, boxes, ...
    # a camera: 20 frames captured, those the loaded machine could not keep up with dropped (counted), in order
    assert lines and all(line.startswith("0 ") for line in lines) and frames == sorted(set(frames)) and frames[-1] < 20
    assert all(int(line.split()[2]) > 0 for line in lines)  # the synthetic camera's words are found


def test_a_loop_left_early_stops_the_pipeline_and_says_its_summary(tiny_bundle):
    from jetpipe.pipelines.config import PipelineConfig, SourceConfig

    config = PipelineConfig(bundle=tiny_bundle, sources=[SourceConfig("synthetic:64x64@30")], metrics_listen="")
    results = jetpipe.iter_results(config)
    seen = []
    for record in results:
        seen.append(record.frame)
        if len(seen) == 5:
            break
    assert seen == [0, 1, 2, 3, 4]
    assert results.summary is not None and sum(results.summary["processed"]) >= 5  # it ended, drained
