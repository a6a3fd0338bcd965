"""One look at the GPU through the driver, without creating a CUDA context.

`jetpipe doctor`, the engine builder (which compute capability it builds on),
CudaDevice and the test suite's GPU check all ask here.
"""

from __future__ import annotations

from dataclasses import dataclass

PYCUDA_MISSING = ("PyCUDA is not installed: pip install 'jetpipe[gpu]' (needs the CUDA toolkit); "
                  "using the CPU runtime needs nothing")


@dataclass(frozen=True)
class GpuFacts:
    pycuda: str | None = None         # PyCUDA's version, None when it is not installed
    name: str | None = None
    compute_capability: str | None = None
    total_memory_mib: int | None = None
    integrated: bool = False          # a Jetson-style GPU sharing host memory
    can_map_host_memory: bool = False
    devices: int = 0
    reason: str | None = None         # why no GPU is usable here (None: one is)

    @property
    def usable(self) -> bool:
        return self.reason is None


def probe_gpu(ordinal: int = 0) -> GpuFacts:
    """Facts about GPU `ordinal` from driver queries (cuInit, device attributes): no context is created."""
    try:
        import pycuda
        import pycuda.driver as cuda
    except ImportError:
        return GpuFacts(reason=PYCUDA_MISSING)
    version = pycuda.VERSION_TEXT
    try:
        cuda.init()
        count = cuda.Device.count()
        if ordinal >= count:
            return GpuFacts(pycuda=version, devices=count,
                            reason="no CUDA GPU found" if count == 0 else f"GPU {ordinal} requested, {count} found")
        device = cuda.Device(ordinal)
        major, minor = device.compute_capability()
        attr = cuda.device_attribute
        return GpuFacts(pycuda=version, name=device.name(), compute_capability=f"{major}.{minor}",
                        total_memory_mib=device.total_memory() >> 20,
                        integrated=bool(device.get_attribute(attr.INTEGRATED)),
                        can_map_host_memory=bool(device.get_attribute(attr.CAN_MAP_HOST_MEMORY)), devices=count)
    except Exception as exc:  # driver missing or too old
        return GpuFacts(pycuda=version, reason=f"CUDA driver unavailable: {exc}")
