"""A batch's work on the GPU once its frames are placed: the kernel, the inference (here, on the high-priority
lane, or on a Triton server), the reduction and the copies back; and, once collected, its outputs and the
GPU time it took. GpuRuntime claims the buffer sets and uploads the frames; BatchLauncher does the rest."""

from __future__ import annotations

import numpy as np

from jetpipe.errors import JetpipeError
from jetpipe.runtime.api import Ticket
from jetpipe.runtime.base import at_width
from jetpipe.runtime.gpu_sets import BufferSet, ModelInstance

STAGES = {"h2d": ("h2d_start", "h2d_end"), "preprocess": ("pre_start", "pre_end"),
          "infer": ("pre_end", "infer_end"), "postprocess": ("infer_end", "post_end"),
          "d2h": ("post_end", "d2h_end")}


def busy_added_ms(engine_ms: float, previous_end_after_start_ms: float) -> float:
    """The part of a batch's span [start, start + engine_ms] not covered by the batches before it, the last
    of which ended at start + previous_end_after_start_ms. Spans start in order (the compute stream) and end in
    order (the stream they finish on), so summed over the batches this is the union of their spans; the sum of
    the spans counts each overlap twice. With model instances running two batches at once, only the batch
    before is subtracted: the union of each batch with its predecessor, which is the whole union while no batch
    overlaps one two places back (two instances alternating)."""
    return engine_ms - min(engine_ms, max(0.0, previous_end_after_start_ms))


class BatchLauncher:
    """Queues a placed batch's kernels, inference and copies on the streams of the model instance it runs on
    (ticket.instance), and reads a finished batch's outputs. lane: the high-priority stream the inference runs
    after the compute stream's kernel on (None: on the compute stream; one instance only). input_chw: the
    engine input's channels and height (a remote backend's input is copied to the host at the batch's width)."""

    def __init__(self, device, instances: list[ModelInstance], reducer, lane, input_chw: tuple[int, int],
                 buffer_sets: int, remote: bool):
        self.device, self.instances, self.reducer, self.lane = device, instances, reducer, lane
        self.backend = instances[0].backend  # the outputs' specs and shapes: the same in every instance
        self.input_chw, self.remote = input_chw, remote
        self.output_bytes_downloaded = 0  # bytes of outputs (or compact reductions) copied device -> host
        # each batch's end again, in a ring one longer than the sets: batch N reads batch N-1's end,
        # which batch N+sets overwrites, and that one cannot start before batch N's set is free
        self._ends = [device.event() for _ in range(buffer_sets + 1)]
        self._batches_run = 0

    def launch(self, buffers: BufferSet, ticket: Ticket) -> None:
        """Everything after the upload, then the events collect() waits on and times the batch by."""
        finish = self.instances[ticket.instance].streams.finish()
        if ticket.batch:
            self._enqueue(buffers, ticket)
            buffers.span[1].record(finish)
            ticket.run_number = self._batches_run
            self._ends[self._batches_run % len(self._ends)].record(finish)
            self._batches_run += 1
        buffers.done.record(finish)

    def _enqueue(self, buffers: BufferSet, ticket: Ticket) -> None:
        instance = self.instances[ticket.instance]
        stream, batch, backend = instance.streams.compute, ticket.batch, instance.backend
        buffers.span[0].record(stream)  # once the stream is free and the frames are on the device
        buffers.mark("pre_start", stream)
        buffers.preprocessor.launch(batch, int(buffers.input), stream)
        buffers.mark("pre_end", stream)
        if self.remote:
            self._send(buffers, ticket, stream)
            return
        if self.lane is not None:
            self.lane.run_after(stream, lambda lane: backend.run(ticket.set_index, batch, lane, ticket.width))
        else:
            backend.run(ticket.set_index, batch, stream, ticket.width)
        buffers.mark("infer_end", stream)
        shapes = backend.output_shapes[ticket.width]
        if self.reducer is not None:  # its kernels and copies on the post stream, once the outputs are written
            buffers.inferred.record(stream)
            stream = instance.streams.finish()
            stream.wait_for_event(buffers.inferred)
            self._reduce(buffers, ticket, stream, shapes[0])
        buffers.mark("post_end", stream)
        if self.reducer is not None:
            self._download_reduced(ticket, stream, shapes[0])
        for spec, shape in zip(self.backend.outputs, shapes):
            if spec.name not in buffers.host_outputs:
                continue  # reduced on the device: only the reduction's arrays come back
            host = at_width(buffers.host_outputs[spec.name], batch, shape)
            self.device.cuda.memcpy_dtoh_async(host, buffers.outputs[spec.name], stream)
            self.output_bytes_downloaded += host.nbytes
        buffers.mark("d2h_end", stream)

    def _reduce(self, buffers: BufferSet, ticket: Ticket, stream, sample_shape) -> None:
        """The reduction's kernels on the outputs in device memory."""
        self.reducer.place(ticket.set_index, ticket.letterboxes)
        self.reducer.launch(ticket.set_index, ticket.batch, buffers.output_addresses(self.backend.outputs), stream,
                            sample_shape)

    def _download_reduced(self, ticket: Ticket, stream, sample_shape) -> None:
        self.output_bytes_downloaded += self.reducer.download(ticket.set_index, ticket.batch, stream, sample_shape)

    def _send(self, buffers: BufferSet, ticket: Ticket, stream) -> None:
        """The preprocessed batch to host memory, then to the Triton server (the request is asynchronous:
        answer() waits for it). The stage marks after preprocessing say nothing of the server."""
        if buffers.host_input is not None:  # not with CUDA shared memory: the server reads the device buffer
            host = at_width(buffers.host_input, ticket.batch, (*self.input_chw, ticket.width))
            self.device.cuda.memcpy_dtoh_async(host, buffers.input, stream)
        stream.synchronize()  # the request may go once the input is where the server reads it
        self.backend.run(ticket.set_index, ticket.batch, stream, ticket.width)
        for mark in ("infer_end", "post_end", "d2h_end"):
            buffers.mark(mark, stream)

    def outputs(self, buffers: BufferSet, ticket: Ticket) -> dict[str, np.ndarray]:
        """A finished local batch's outputs: views of the set's host outputs, or the reduction's arrays."""
        shapes = self.backend.output_shapes[ticket.width]
        if self.reducer is not None:
            return self._reduced(ticket, shapes[0])
        return {spec.name: at_width(buffers.host_outputs[spec.name], ticket.batch, shape)
                for spec, shape in zip(self.backend.outputs, shapes)}

    def answer(self, buffers: BufferSet, ticket: Ticket) -> dict[str, np.ndarray]:
        """Wait for the server's outputs (in host memory); with a reduction, uploaded and reduced here."""
        self.backend.finish(ticket.set_index)
        shapes = self.backend.output_shapes[ticket.width]
        on_device = buffers.host_input is None  # CUDA shared memory: the outputs are in the device buffers
        stream = self.instances[0].streams.answer  # a server's model: one instance here (the server has its own)
        if self.reducer is None:
            outputs = {spec.name: at_width(buffers.host_outputs[spec.name], ticket.batch, shape)
                       for spec, shape in zip(self.backend.outputs, shapes)}
            if on_device:
                with self.device.active():
                    for spec in self.backend.outputs:
                        self.device.cuda.memcpy_dtoh_async(outputs[spec.name], buffers.outputs[spec.name], stream)
                        self.output_bytes_downloaded += outputs[spec.name].nbytes
                    stream.synchronize()
            return outputs
        with self.device.active():
            if not on_device:
                for spec, shape in zip(self.backend.outputs, shapes):
                    host = at_width(buffers.host_outputs[spec.name], ticket.batch, shape)
                    self.device.cuda.memcpy_htod_async(buffers.outputs[spec.name], host, stream)
            self._reduce(buffers, ticket, stream, shapes[0])
            self._download_reduced(ticket, stream, shapes[0])
            stream.synchronize()
        return self._reduced(ticket, shapes[0])

    def _reduced(self, ticket: Ticket, sample_shape) -> dict[str, np.ndarray]:
        """The reduction's arrays of a finished batch; what its kernels wrote into mapped memory counted."""
        self.output_bytes_downloaded += self.reducer.written(ticket.set_index, ticket.batch)
        return self.reducer.host(ticket.set_index, ticket.batch, sample_shape)

    def engine_ms(self, buffers: BufferSet, ticket: Ticket) -> tuple[float | None, float | None]:
        """The GPU's time on a collected batch, from the compute stream reaching it to its outputs in host
        memory (waiting behind earlier batches not counted), and what of it did not overlap the batch before
        (busy_added_ms); None, None for an empty batch."""
        if not ticket.batch:
            return None, None
        with self.device.active():
            engine_ms = buffers.span[1].time_since(buffers.span[0])
            if not ticket.run_number:
                return engine_ms, engine_ms
            previous_end = self._ends[(ticket.run_number - 1) % len(self._ends)]
            return engine_ms, busy_added_ms(engine_ms, previous_end.time_since(buffers.span[0]))

    def stage_times(self, buffers: BufferSet) -> dict[str, float]:
        """GPU milliseconds per stage of a collected batch (a runtime opened with profile=True)."""
        if buffers.marks is None:
            raise JetpipeError("stage times need a runtime opened with profile=True")
        with self.device.active():
            marks = buffers.marks
            return {stage: marks[end].time_since(marks[start]) for stage, (start, end) in STAGES.items()}
