"""The batch buckets ONNX Runtime's CUDA sessions are made for (the sessions themselves: test_gpu.py)."""

import pytest

from jetpipe.runtime.backends import batch_buckets


@pytest.mark.parametrize(("max_batch", "buckets"), [
    (1, [1]), (3, [1, 2, 3]), (8, [1, 2, 3, 4, 5, 6, 7, 8]), (9, [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    (16, [1, 2, 3, 4, 5, 6, 7, 8, 16]), (24, [1, 2, 3, 4, 5, 6, 7, 8, 16, 24]),
])
def test_every_size_up_to_8_has_a_bucket_of_its_own_then_powers_of_two_and_the_maximum(max_batch, buckets):
    assert batch_buckets(max_batch) == buckets


def test_powers_of_two_alone_where_no_size_is_to_have_its_own():
    assert batch_buckets(8, every_size_up_to=1) == [1, 2, 4, 8]
    assert batch_buckets(6, every_size_up_to=1) == [1, 2, 4, 6]


def test_out_of_memory_is_told_from_other_errors_by_what_onnx_runtime_and_cuda_say():
    from jetpipe.runtime.backends import out_of_memory

    assert out_of_memory(RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned "
                                      "while running Conv node. Failed to allocate memory for requested buffer of "
                                      "size 209715200"))
    assert out_of_memory(RuntimeError("CUDA failure 2: out of memory ; GPU=0 ; expr=cudaMalloc(&p, size);"))
    assert not out_of_memory(RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while "
                                          "running Conv node: CUDNN_STATUS_EXECUTION_FAILED"))
