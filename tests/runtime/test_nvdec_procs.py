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
