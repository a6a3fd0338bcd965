"""What every convert step knows about an op type, in one registry (one policy per op type).

ONNX Runtime's quantization/registry.py is the model: the INT8 placement, 2:4
sparsity, FP16 and pruning each used to keep their own table of op types; they
now all ask `policy(op_type)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx

from jetpipe.convert.graph import attribute

# FP16 treatment
HALF = "half"            # computed in float16
FLOAT32 = "float32"      # computed in float32 regardless (numerically delicate, or no fp16 kernels)
REDUCTION = "reduction"  # float16 unless its input's range says the sum overflows


@dataclass(frozen=True)
class WeightAxes:
    """Axes of a compute op's weight (input 1): output channels (INT8 per-channel scales) and
    the reduction axis (2:4 sparsity groups along it); None: the op cannot take 2:4."""

    output: Callable[[onnx.NodeProto], int]
    reduction: Callable[[onnx.NodeProto], int | None] | None = None


@dataclass(frozen=True)
class OpPolicy:
    weights: WeightAxes | None = None   # a compute op: INT8 Q/DQ on input 0 and the weight, 2:4 sparsity
    fp16: str = HALF
    fp32_inputs: frozenset[int] = frozenset()  # inputs the ONNX spec requires in float32
    channelwise: bool = False  # pruning: a channel space passes through unchanged
    elementwise: bool = False  # pruning: a binary op whose two activation inputs must be pruned alike
    tensorrt: bool = True      # TensorRT's ONNX parser can build it
    quantized: bool = False    # the model is quantized already (Q/DQ, ONNX Runtime's integer ops)


def _trans_b(node: onnx.NodeProto) -> bool:
    return bool(attribute(node, "transB", 0))


def _conv_reduction(node: onnx.NodeProto) -> int | None:
    return 1 if attribute(node, "group", 1) == 1 else None  # grouped/depthwise: no 2:4 pattern


_CHANNELWISE = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh", "Elu", "Selu",
                "Softplus", "Identity", "Neg", "Abs", "MaxPool", "Pad", "BatchNormalization")
_FLOAT32 = ("Range", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike",
            "NonMaxSuppression", "TopK", "Einsum")
# an fp16 sum of many large values overflows even when the mean fits
_REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceL2", "ReduceSumSquare", "Softmax", "LayerNormalization",
               "InstanceNormalization")
# onnx-tensorrt's operator matrix: ops TensorRT 10.x has no layer for (sequences, strings, ONNX Runtime-style
# integer quantized ops, training losses)
_NOT_TENSORRT = ("SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
                 "SequenceLength", "ConcatFromSequence", "SplitToSequence", "StringNormalizer", "TfIdfVectorizer",
                 "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "Multinomial")
# ONNX Runtime's quantization output (dynamic and static QOperator formats, com.microsoft's too)
_INTEGER_OPS = ("ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "DynamicQuantizeLinear",
                "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
                "QLinearGlobalAveragePool", "QLinearAveragePool", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
                "QGemm", "QAttention")

POLICIES: dict[str, OpPolicy] = {
    **{op: OpPolicy(channelwise=True) for op in _CHANNELWISE},
    **{op: OpPolicy(fp16=FLOAT32) for op in _FLOAT32},
    **{op: OpPolicy(fp16=REDUCTION) for op in _REDUCTIONS},
    **{op: OpPolicy(tensorrt=False) for op in _NOT_TENSORRT},
    **{op: OpPolicy(tensorrt=False, quantized=True) for op in _INTEGER_OPS},
    **{op: OpPolicy(quantized=True) for op in ("QuantizeLinear", "DequantizeLinear")},
    "Conv": OpPolicy(weights=WeightAxes(output=lambda n: 0, reduction=_conv_reduction)),  # K x C x R x S
    "ConvTranspose": OpPolicy(weights=WeightAxes(output=lambda n: 1)),  # C_in x K/group x R x S
    "Gemm": OpPolicy(weights=WeightAxes(output=lambda n: 0 if _trans_b(n) else 1,
                                        reduction=lambda n: 1 if _trans_b(n) else 0)),
    "MatMul": OpPolicy(weights=WeightAxes(output=lambda n: 1, reduction=lambda n: 0)),  # K x N
    "Resize": OpPolicy(channelwise=True, fp32_inputs=frozenset({1, 2})),
    "Upsample": OpPolicy(channelwise=True, fp32_inputs=frozenset({1})),
    "AveragePool": OpPolicy(channelwise=True, fp16=REDUCTION),
    "GlobalAveragePool": OpPolicy(channelwise=True, fp16=REDUCTION),
    "GlobalMaxPool": OpPolicy(channelwise=True),
    **{op: OpPolicy(elementwise=True) for op in ("Add", "Mul", "Sub", "Div")},
}
DEFAULT = OpPolicy()


def policy(op_type: str) -> OpPolicy:
    return POLICIES.get(op_type, DEFAULT)
