"""Bounds on sizes users choose, stated once (a batch of 100000 frames is a typo, not a plan)."""

MAX_BATCH = 256  # frames per engine batch: --max-batch of convert and serve, calibrate latency --batch
MAX_SIDE = 16384  # pixels: frames and network inputs (TensorRT's and NVDEC's limits are below it)
MAX_QUEUE_DEPTH = 1024  # frames per stream waiting to be batched
MAX_STREAMS = 256  # streams one daemon serves at once (the control API's max_streams)
MAX_DECODE_PROCESSES = 32  # processes NVDEC files are decoded in (serve's decode_processes)
MAX_DECODE_THREADS = 32    # decoding threads in each of them (serve's decode_threads)
MAX_GPUS = 64  # GPU numbers: serve --gpus, export triton --gpus
MAX_WORKERS_PER_GPU = 16  # serving processes on one GPU (serve --workers-per-gpu)
MAX_MODEL_INSTANCES = 4  # copies of the model one GPU runtime runs batches on at once (serve --model-instances)
