"""One-off (session 55, H100): PyNvVideoCodec's PacketData filled from PyAV's packets decodes on NVDEC.

  python docs/results/busy_2026-12-06_s55/pyav_into_nvdec.py STREAM.ts   (from the repository root)

Printed: PacketData's fields, and how many frames NVDEC gave for the packets PyAV demuxed (words72.ts, words72.mp4
copied into MPEG-TS: 600 of 600). The run itself was of an earlier draft of this script (the same steps)."""
import sys
import time

import av
import numpy as np
import PyNvVideoCodec as nvc

sys.path.insert(0, ".")
from jetpipe.runtime.cuda import CudaDevice  # noqa: E402

print("PacketData:", [n for n in dir(nvc.PacketData()) if not n.startswith("__")])
device = CudaDevice(0)
with device.active():
    codec = nvc.CreateDemuxer(filename=sys.argv[1]).GetNvCodecId()
    decoder = nvc.CreateDecoder(gpuid=0, codec=codec, cudacontext=device.context.handle, cudastream=0,
                                usedevicememory=True)
    container = av.open(sys.argv[1])
    frames, kept, started = 0, [], time.thread_time()
    for packet in container.demux(container.streams.video[0]):
        if not packet.size:
            continue
        data = np.frombuffer(bytes(packet), np.uint8)
        kept.append(data)
        filled = nvc.PacketData()
        filled.bsl_data, filled.bsl, filled.pts = data.ctypes.data, data.size, packet.pts or 0
        frames += len(decoder.Decode(filled))
    frames += len(decoder.Decode(nvc.PacketData()))  # the flush
    print("PyAV-demuxed packets decoded by NVDEC:", frames, "frames; CPU", round(time.thread_time() - started, 3), "s")
