"""A decode process's lanes (threads): every stream it is given gets one, the fewest streams each."""

from jetpipe.runtime.nvdec_procs import DecodeWorker, _Lane


def test_a_decode_process_spreads_every_other_stream_over_all_its_lanes():
    worker = DecodeWorker.__new__(DecodeWorker)  # its lanes only: no CUDA device, no pipe
    worker.lanes = [_Lane(worker, k) for k in range(4)]
    worker._lane_of = {}
    for stream in (0, 2, 4, 6, 8, 10, 12, 14):  # what the first of 2 processes is given, in turn
        worker.assign_lane(stream).streams[stream] = object()
    assert [len(lane.streams) for lane in worker.lanes] == [2, 2, 2, 2]  # by stream % 4: [4, 0, 4, 0]
    assert worker.lane(6) is worker.lanes[3]
    assert worker.lane(99) is worker.lanes[0]  # never opened here: its credits find nothing


def test_a_stream_that_ended_leaves_its_lane_to_the_next():
    import threading
    from types import SimpleNamespace

    worker = DecodeWorker.__new__(DecodeWorker)
    worker.lanes = [_Lane(worker, k) for k in range(2)]
    worker._lane_of, worker.removed, worker.lock = {}, [], threading.Lock()
    worker.say = lambda *message: None  # no pipe here
    worker.assign_lane(0).streams[0] = object()
    worker.assign_lane(1).streams[1] = object()
    del worker.lanes[0].streams[0]  # the lane pops a stream before it says it ended
    worker.ended(SimpleNamespace(stream=0, frames=3, source=SimpleNamespace(decode_errors=0)), "removed")
    assert 0 not in worker._lane_of and worker.lane(0) is worker.lanes[0]
    assert worker.assign_lane(2) is worker.lanes[0]  # the lane it freed


class _CopyingSource:
    """Stands for an NvdecSource: what a lane calls, in order."""

    def __init__(self, name: str, calls: list, fail_copy: bool = False):
        from jetpipe.video import FrameInfo

        self.name, self.calls, self.fail_copy = name, calls, fail_copy
        self.info = FrameInfo("nv12", 4, 4, "bt709", "limited", 30.0)
        self.decode_errors = 0

    def start_read(self, slot) -> float:
        self.calls.append(("decode and queue the copy", self.name, slot.address))
        return 1.5

    def finish_read(self) -> None:
        self.calls.append(("wait for the copy", self.name))
        if self.fail_copy:
            raise RuntimeError("an illegal address")

    def close(self) -> None:
        self.calls.append(("close", self.name))


def _lane_with(sources):
    import threading
    from collections import deque
    from types import SimpleNamespace

    from jetpipe.runtime.nvdec_procs import _Decoding

    said = []
    worker = SimpleNamespace(slots=SimpleNamespace(address=lambda key, device: key), device=None,
                             say=lambda *message: said.append(message), lock=threading.Lock(), removed=[],
                             _lane_of={}, send=lambda data: said.append(data))
    lane = _Lane(worker, 0)
    decodings = [_Decoding(k, source, 24, 0, credits=deque([(7, 1000 + k)])) for k, source in enumerate(sources)]
    return lane, decodings, said


def test_a_lane_queues_every_streams_decode_and_copy_before_it_waits_for_the_copies():
    from jetpipe.runtime.nvdec_procs import RECORD

    calls = []
    lane, decodings, _ = _lane_with([_CopyingSource("a", calls), _CopyingSource("b", calls)])
    records = lane._round(decodings)
    assert calls == [("decode and queue the copy", "a", 1000), ("decode and queue the copy", "b", 1001),
                     ("wait for the copy", "a"), ("wait for the copy", "b")]
    assert [RECORD.unpack(r) for r in records] == [(0, 7, 1.5, 0), (1, 7, 1.5, 0)]
    assert all(not d.credits and d.frames == 1 for d in decodings)


def test_a_copy_that_fails_is_a_failed_read_and_the_other_streams_frames_still_go():
    calls = []
    lane, decodings, said = _lane_with([_CopyingSource("a", calls, fail_copy=True), _CopyingSource("b", calls)])
    records = lane._round(decodings)
    assert len(records) == 1 and ("close", "a") in calls
    assert decodings[0].failed and decodings[0].credits  # its credit stays: the slot was not written
    assert said[0][:2] == ("failed", 0)
