"""CUDA layer: the only part of jetpipe that imports pycuda, tensorrt or ONNX Runtime's GPU parts.

Nothing here is imported by `import jetpipe`; modules import their GPU
dependencies lazily so the package works on machines without them.
"""
