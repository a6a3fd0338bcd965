"""decode_processes = "auto": a decode process only where NVDEC files could go faster than the serving process
decodes (decode_choice); the configuration and the command line take auto."""

import pytest

from jetpipe.cli import _serve_config, build_parser
from jetpipe.pipelines.config import ConfigError, PipelineConfig, SourceConfig, validate
from jetpipe.pipelines.ingest.decode_choice import MIN_FILES, SERVING_DECODE_FPS, SERVING_DECODE_FPS_CLIPS, choose

LIGHT_FPS = 11_000.0  # a YOLOv8n at 320 at batch 32 on an H100, about
HEAVY_FPS = 950.0     # PP-OCRv4 det at 1080p


def test_many_files_into_a_light_model_get_one_process_and_the_log_says_why():
    choice = choose(64, 0, LIGHT_FPS)
    assert choice.processes == 1
    assert "64 NVDEC files" in choice.why and "11,000 frames/s" in choice.why and "decode_processes = 0" in choice.why


@pytest.mark.parametrize("files, realtime, engine_fps, held_by", [
    (MIN_FILES - 1, 0, LIGHT_FPS, "fewer than 8"),                  # too few to matter
    (64, 0, HEAVY_FPS, "the model runs 950 frames/s"),              # the model is the limit
    (64, 64, LIGHT_FPS, "the files offer 1,920 frames/s"),          # 64 cameras offer less than this decodes
    (64, 0, None, "not measured here"),                             # a server's model
])
def test_decoding_stays_here_where_it_is_not_the_limit(files, realtime, engine_fps, held_by):
    choice = choose(files, realtime, engine_fps)
    assert choice.processes == 0 and held_by in choice.why and "decoding in this process" in choice.why


def test_with_clips_on_a_process_is_chosen_sooner_not_never():
    """Keeping every packet, this process decodes less (1,702 frames/s against 2,010 on an H200), and a decode
    process with the rings kept served 4,411: 64 cameras (1,920 frames/s) go to a process with clips on and stay
    here without; 16 (480 frames/s) stay here either way, where keeping the packets costs least."""
    assert SERVING_DECODE_FPS_CLIPS < 64 * 30 < SERVING_DECODE_FPS
    with_clips = choose(64, 64, LIGHT_FPS, clips=True)
    assert with_clips.processes == 1 and "with clips on (~1,500 frames/s)" in with_clips.why
    assert choose(64, 64, LIGHT_FPS).processes == 0
    assert choose(16, 16, LIGHT_FPS, clips=True).processes == 0
    assert choose(64, 0, LIGHT_FPS, clips=True).processes == 1
    assert choose(64, 0, HEAVY_FPS, clips=True).processes == 0  # the model is the limit: decoding here


def test_enough_live_files_into_a_light_model_go_to_a_process():
    streams = int(SERVING_DECODE_FPS // 30) + 1
    assert choose(streams, streams, LIGHT_FPS).processes == 1
    assert choose(streams, streams, HEAVY_FPS).processes == 0


def test_auto_is_the_default_and_is_taken_from_toml_and_the_command_line(tmp_path):
    assert PipelineConfig(bundle=tmp_path, sources=[]).decode_processes == "auto"
    path = tmp_path / "serve.toml"
    path.write_text("[pipeline]\nbundle = 'b'\ndecode_processes = 'auto'\ndecode_threads = 2\n"
                    "[[source]]\nuri = 'a.mp4'\n")
    args = build_parser().parse_args(["serve", str(path), "--decode-processes", "auto"])
    assert _serve_config(args).decode_processes == "auto"
    args = build_parser().parse_args(["serve", str(path), "--decode-processes", "2"])
    assert _serve_config(args).decode_processes == 2


def test_a_word_other_than_auto_is_one_line():
    config = PipelineConfig(bundle="b", sources=[SourceConfig("synthetic")], decode_processes="fast")
    with pytest.raises(ConfigError, match=r"^flags: decode_processes = 'fast': allowed auto \(where they pay\) or "
                                          r"an integer from 0"):
        validate(config, "flags")


def test_decode_threads_go_with_auto():  # they size the processes auto chooses (with 0 they are refused)
    validate(PipelineConfig(bundle="b", sources=[SourceConfig("a.mp4")], decode_threads=2), "flags")
