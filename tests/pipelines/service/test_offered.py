"""What a configuration's streams offer the model before any is opened: model_instances auto weighs it against
the model's measured rate (issue 66)."""

import math

import pytest

from jetpipe.pipelines.config import ConfigError, PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.service.offered import instance_options, offered_fps


def test_cameras_count_30_a_second_synthetic_ones_their_own_and_a_file_read_at_once_everything(tmp_path):
    cameras = [SourceConfig("rtsp://cam/1"), SourceConfig("tcp://127.0.0.1:9000"), SourceConfig("/dev/video0")]
    assert offered_fps(cameras) == 90.0
    assert offered_fps([SourceConfig("synthetic:320x240@15"), SourceConfig("synthetic")]) == 45.0
    assert offered_fps([SourceConfig(str(tmp_path / "a.mp4"), realtime=True)] * 32) == 960.0
    assert math.isinf(offered_fps([SourceConfig("rtsp://cam/1"), SourceConfig(str(tmp_path / "a.mp4"))]))
    assert offered_fps([]) == 0.0  # streams added later through the control API: not known


def test_auto_passes_what_the_streams_offer_and_a_number_passes_nothing(tmp_path):
    auto = validate(PipelineConfig(bundle=tmp_path, sources=[SourceConfig("synthetic:@25")] * 4,
                                   model_instances="auto"))
    assert instance_options(auto) == {"instances": "auto", "offered_fps": 100.0}
    two = validate(PipelineConfig(bundle=tmp_path, sources=[SourceConfig("synthetic")], model_instances=2))
    assert instance_options(two) == {"instances": 2, "offered_fps": 0.0}
    with pytest.raises(ConfigError, match=r"model_instances = 'many': allowed auto \(two where the streams come "
                                          r"near the model's rate\) or an integer from 1 to 4"):
        validate(PipelineConfig(bundle=tmp_path, sources=[SourceConfig("synthetic")], model_instances="many"))
