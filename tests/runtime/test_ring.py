"""Frame rings: preallocated slots, views without copies, device slots for hardware decoders."""

import numpy as np
import pytest

from jetpipe.errors import JetpipeError
from jetpipe.runtime.ring import DeviceSlot, FrameRing, host_ring


def test_slots_are_handed_out_once_and_come_back():
    ring = host_ring(3, 64 * 48 * 3)
    taken = [ring.acquire() for _ in range(3)]
    assert sorted(taken) == [0, 1, 2] and ring.acquire() is None and ring.free_slots() == 0
    ring.release(taken[1])
    assert ring.acquire() == taken[1]


def test_views_and_frames_share_the_slot_memory():
    ring = host_ring(2, 64 * 48 * 3)
    view = ring.view(1, "nv12", 48, 64)
    assert view.shape == (72, 64) and np.shares_memory(view, ring.buffers[1])
    view[:] = 7
    frame = ring.frame(1, "nv12", 48, 64, "bt709", "full")
    assert np.shares_memory(frame.data, ring.buffers[1]) and frame.data.max() == 7
    assert (frame.standard, frame.range, frame.size()) == ("bt709", "full", (48, 64))
    assert ring.view(0, "yuyv", 48, 64).shape == (48, 128) and ring.view(0, "bgr", 48, 64).shape == (48, 64, 3)


def test_device_slots_describe_where_a_decoder_writes():
    ring = FrameRing([object(), object()], [0x1000, 0x9000], pinned=False, device=True, slot_bytes=1920 * 1080 * 3)
    slot = ring.view(1, "nv12", 1080, 1920)
    assert slot == DeviceSlot(0x9000, 1920 * 1080 * 3 // 2, "nv12", 1080, 1920)
    frame = ring.frame(1, "nv12", 1080, 1920, "bt709")
    assert frame.device and frame.data is None and frame.address == 0x9000
    assert frame.size() == (1080, 1920) and frame.nbytes == slot.nbytes


@pytest.mark.parametrize("device", [False, True])
def test_a_frame_larger_than_the_slot_is_refused_naming_max_frame_hw(device):
    """A network stream's size is known only when it connects: a 4K stream into 1080p slots must not
    write past them (on the device nothing else would stop it)."""
    ring = (FrameRing([object()], [0x1000], pinned=False, device=True, slot_bytes=1920 * 1080 * 3) if device
            else host_ring(1, 1920 * 1080 * 3))
    assert ring.view(0, "nv12", 1080, 1920) is not None
    with pytest.raises(JetpipeError, match="max_frame_hw"):
        ring.view(0, "nv12", 2160, 3840)


def test_a_ring_borrows_from_its_pool_when_its_own_slots_are_used_and_gives_back_to_it():
    pool, first, second = host_ring(2, 64 * 48 * 3), host_ring(2, 64 * 48 * 3), host_ring(1, 64 * 48 * 3)
    first.share(pool)
    second.share(pool)
    own = [first.acquire(), first.acquire()]
    borrowed = first.acquire()
    assert sorted(own) == [0, 1] and borrowed in (2, 3) and first.in_use() == 3 and first.free_slots() == 0
    view = first.view(borrowed, "nv12", 48, 64)
    assert np.shares_memory(view, pool.buffers[borrowed - 2])  # the pool's memory, under the ring's slot number
    view[:] = 9
    assert first.frame(borrowed, "nv12", 48, 64).data.max() == 9
    second.acquire()
    assert second.acquire() is not None and second.acquire() is None  # its own one, then the pool's last
    first.release(borrowed)
    assert first.in_use() == 2 and pool.free_slots() == 1
    for slot in own:
        first.release(slot)
    assert first.in_use() == 0 and first.free_slots() == 2


def test_a_pool_of_other_memory_or_smaller_slots_is_refused():
    ring = host_ring(1, 64 * 48 * 3)
    with pytest.raises(JetpipeError, match="shared pool"):
        ring.share(FrameRing([object()], [0x1000], pinned=False, device=True, slot_bytes=64 * 48 * 3))
    with pytest.raises(JetpipeError, match="shared pool"):
        ring.share(host_ring(1, 64 * 48))
