"""One daemon on every GPU of a host: a worker process per GPU, one face.

    face (this process): the sinks that take records, /metrics /healthz /streams, the summary, signals
      |-- worker on GPU 0 (CUDA_VISIBLE_DEVICES=0): the present pipeline over its share of the streams
      `-- worker on GPU 1 ...

Each worker is a whole pipeline (its CUDA context, NVDEC, batcher, runtime, postprocessing, secondaries, and
the sinks that draw frames, which must sit where the frames are); the records it makes come to the face over
a pipe, in order, and the face hands them to its sinks. A stream lives on one worker, so its records stay in
order. plan.py says which GPUs and which streams go where, workers_choice.py how many workers a GPU gets
(`--workers-per-gpu auto`); worker.py is the worker's side; face.py the face's,
with workers.py (a worker's process as the face sees it), routes.py (the control API sent on), scrape.py
(/metrics and the preview merged), totals.py (the summary) and channel.py (what the two say to each other).
"""
