"""Pruning with calibration data: choose channels by least squares, refit the following convolutions.

The refit solves, for each Conv that consumes a pruned group, a ridge least-squares
problem on sampled output positions (im2col): the pruned network's own inputs to
that layer must reproduce the dense network's outputs of it. No training needed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from jetpipe.convert.graph import GraphIndex, attribute, expose_outputs
from jetpipe.runtime.sessions import cpu_session, run_in_batches


def activations(model: onnx.ModelProto, names: list[str], samples: np.ndarray, input_name: str) -> dict:
    """The named tensors on `samples` (an unoptimized CPU session: names survive)."""
    session = cpu_session(expose_outputs(model, names), optimize=False)
    return dict(zip(names, run_in_batches(session, samples, len(samples), names)))


def outputs(model: onnx.ModelProto, samples: np.ndarray, input_name: str, batch: int = 4) -> list[np.ndarray]:
    """All graph outputs on `samples`, run a few at a time."""
    return run_in_batches(cpu_session(model), samples, batch)


def normalized_mse(reference: list[np.ndarray], candidate: list[np.ndarray]) -> float:
    """Squared error over the reference's variance, summed over the outputs."""
    return float(sum(((c.astype(np.float64) - r) ** 2).mean() / max(float(r.var()), 1e-12)
                     for r, c in zip(reference, candidate)))


def reconstruct(old: dict, model, keep_in: dict, keep_out: dict, acts, samples, input_name,
                steps=None) -> tuple[onnx.ModelProto, list[str]]:
    """Refit every Conv whose input channels were cut, in graph order, on the pruned model's own inputs;
    returns the model and the Convs too wide to refit (see `refittable`).

    old: the dense model's initializers as arrays; keep_in / keep_out: each Conv's kept input / output
    channels (prune_spaces.conv_channels)."""
    rng = np.random.default_rng(0)
    too_wide = []
    for node in list(model.graph.node):
        if node.name not in keep_in:
            continue
        if refittable(node, old, keep_in[node.name]):
            x_new = activations(model, [node.input[0]], samples, input_name)[node.input[0]]
            refit_node(model, node, old, acts[node.input[0]], x_new, keep_in[node.name], keep_out, rng)
        else:
            too_wide.append(node.name)
        if steps is not None:
            steps.update(1)
    return model, too_wide


def refittable(node, old: dict, keep_in) -> bool:
    """Least squares are solved for Convs up to MAX_OBS_COLUMNS wide: a wider one (a 2048-channel 3x3 ASPP
    branch: 18432 columns, more than the MAX_POSITIONS positions sampled, and a 2.7 GB Gram matrix) keeps
    its plainly sliced weights."""
    return not too_wide(old[node.input[1]], len(keep_in))


def too_wide(weight: np.ndarray, channels: int) -> bool:
    """Whether a Conv's im2col width over `channels` of its input (channels x kernel taps) is above
    MAX_OBS_COLUMNS: no Gram matrix is formed for it (ranking or refit)."""
    return channels * int(np.prod(weight.shape[2:])) > MAX_OBS_COLUMNS


def refit_node(model, node, old: dict, x_old, x_new, keep_in, keep_out: dict, rng) -> None:
    """Refit one consumer Conv of `model` so that on x_new it reproduces the dense layer's output on x_old."""
    w_old = old[node.input[1]]
    b_old = old[node.input[2]] if len(node.input) > 2 and node.input[2] else None
    out = keep_out.get(node.name, np.arange(w_old.shape[0]))
    w_new, b_new = _refit(node, w_old, b_old, x_old, x_new, keep_in, out, rng)
    _set_weights(model, node, w_new, b_new)


def _set_weights(model, node, w, b) -> None:
    inits = GraphIndex(model.graph).initializers
    inits[node.input[1]].CopyFrom(numpy_helper.from_array(w, node.input[1]))
    if len(node.input) > 2 and node.input[2]:
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(b, node.input[2]))
    else:
        name = f"{node.input[1]}__bias"
        model.graph.initializer.append(numpy_helper.from_array(b, name))
        if len(node.input) == 2:
            node.input.append(name)
        else:
            node.input[2] = name


def _patches(x: np.ndarray, node, kernel, positions) -> np.ndarray:
    """im2col at sampled output positions: (P, C*kh*kw) in the weight's (c, ky, kx) order."""
    kh, kw = kernel
    strides = attribute(node, "strides", [1, 1])
    pads = attribute(node, "pads", [0, 0, 0, 0])
    dil = attribute(node, "dilations", [1, 1])
    padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, oy, ox = positions
    cols = [padded[n, :, oy * strides[0] + ky * dil[0], ox * strides[1] + kx * dil[1]]
            for ky in range(kh) for kx in range(kw)]
    return np.stack(cols, axis=2).reshape(len(n), -1)


RIDGE = 1e-2  # relative to the mean eigenvalue of the Gram matrix (measured: 1e-4 overfits 8 images)
MAX_POSITIONS = 8192
MAX_OBS_COLUMNS = 4608  # a Conv's im2col width (input channels x kernel taps) up to which its Gram matrix is
# formed and inverted, for the ranking and the refit: 512 channels of a 3x3 Conv (170 MB of float64)


def _positions(node, x_shape, kernel, rng) -> tuple:
    """Up to MAX_POSITIONS random (sample, y, x) output positions of a Conv."""
    kh, kw = kernel
    strides = attribute(node, "strides", [1, 1])
    pads = attribute(node, "pads", [0, 0, 0, 0])
    dil = attribute(node, "dilations", [1, 1])
    out_h = (x_shape[2] + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    out_w = (x_shape[3] + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    total = x_shape[0] * out_h * out_w
    pick = rng.choice(total, size=min(total, MAX_POSITIONS), replace=False)
    return np.unravel_index(pick, (x_shape[0], out_h, out_w))


def _design(x, node, kernel, positions) -> np.ndarray:
    """im2col rows plus a ones column (the bias), float64."""
    a = _patches(x, node, kernel, positions)
    return np.concatenate([a, np.ones((len(a), 1), a.dtype)], axis=1).astype(np.float64)


def _ridge_gram(a: np.ndarray) -> tuple[np.ndarray, float]:
    """A^T A plus the ridge on its diagonal, and that ridge."""
    gram = a.T @ a
    ridge = RIDGE * np.trace(gram) / len(gram)
    gram += np.eye(len(gram)) * ridge
    return gram, ridge


def _refit(node, w_old, b_old, x_old, x_new, keep_in, keep_out, rng):
    """W', b' minimising ||conv(x_new, W') + b' - conv(x_old, W_old)|| on sampled positions (ridge)."""
    k, _, kh, kw = w_old.shape
    positions = _positions(node, x_old.shape, (kh, kw), rng)
    target = _patches(x_old, node, (kh, kw), positions) @ w_old.reshape(k, -1).T + (b_old if b_old is not None else 0)
    target = target[:, keep_out]
    assert x_new.shape[1] == len(keep_in), (x_new.shape, len(keep_in))
    a = _design(x_new, node, (kh, kw), positions)
    # the ridge pulls towards the plainly sliced weights, not towards zero: a layer that sees few
    # positions (an SE block's conv after GlobalAveragePool sees one per image) stays near them
    prior = np.concatenate([w_old[keep_out][:, keep_in].reshape(len(keep_out), -1).T,
                            (b_old[keep_out] if b_old is not None else np.zeros(len(keep_out)))[None]])
    gram, ridge = _ridge_gram(a)
    solution = np.linalg.solve(gram, a.T @ target.astype(np.float64) + ridge * prior)
    w_new = solution[:-1].T.reshape(len(keep_out), len(keep_in), kh, kw).astype(np.float32)
    return w_new, solution[-1].astype(np.float32)


OBS_STEPS = 32  # the greedy elimination removes about 1/32 of the remaining channels per step


def obs_ranking(space, weights: dict, convs: dict, acts: dict, keep_at_least: int, rng) -> np.ndarray:
    """Channels most important first, by greedy elimination with least-squares compensation.

    Optimal-brain-surgeon at channel level, on each consumer's im2col Gram matrix G (ridge): removing
    the block S of a channel and refitting the rest costs dE = b_S^T (G^-1_SS)^-1 b_S, where b are the
    consumer's weights; the channels with the least cost over all consumers (each normalized by its
    output energy) go first, a few at a time (OBS_STEPS), and G^-1 and b are updated as if the refit had
    been done. Groups whose consumers are too wide for that (MAX_OBS_COLUMNS) are ranked by energy."""
    windows = [(convs[name], slice(offset, offset + space.channels)) for name, offset in space.consumers]
    if any(too_wide(weights[node.input[1]], space.channels) for node, _ in windows):
        return energy_ranking(windows, weights, acts)
    states = [_obs_state(node, weights, acts, rng, channels) for node, channels in windows]
    alive, removed = list(range(space.channels)), []
    while len(alive) > keep_at_least:
        cost = sum(_obs_costs(*state) for state in states)
        count = min(max(1, len(alive) // OBS_STEPS), len(alive) - keep_at_least)
        picks = np.argsort(cost, kind="stable")[:count]  # cheapest first
        for state in states:
            _obs_remove(state, picks)
        removed.extend(alive[j] for j in picks)
        gone = set(picks.tolist())
        alive = [c for i, c in enumerate(alive) if i not in gone]
    return np.array(alive + removed[::-1])


def energy_ranking(windows, weights: dict, acts: dict) -> np.ndarray:
    """Channels most important first by what they carry into their consumers: the mean square of the
    channel's input times the squared norm of the consumer weights reading it (each consumer weighs alike)."""
    score = 0.0
    for node, channels in windows:
        w = weights[node.input[1]][:, channels].astype(np.float64)
        x = acts[node.input[0]][:, channels].astype(np.float64)
        per = (w ** 2).sum(axis=(0, 2, 3)) * (x ** 2).mean(axis=(0, 2, 3))
        score = score + per / max(per.sum(), 1e-12)
    return np.argsort(-score, kind="stable")


def _obs_state(node, weights, acts, rng, channels: slice) -> list:
    """The consumer's Gram inverse and weights over the group's `channels` of its input (the rest of its
    input, where it reads other groups too, is left out of this group's ranking)."""
    w = weights[node.input[1]][:, channels].astype(np.float64)
    k, c, kh, kw = w.shape
    b = weights[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros(k)
    x = acts[node.input[0]][:, channels]
    a = _design(x, node, (kh, kw), _positions(node, x.shape, (kh, kw), rng))
    beta = np.concatenate([w.reshape(k, -1).T, np.asarray(b, np.float64)[None]], axis=0)  # (c*kk + 1, k)
    energy = max(float(((a @ beta) ** 2).sum()), 1e-12)
    return [np.linalg.inv(_ridge_gram(a)[0]), beta, energy, kh * kw]


def _obs_costs(g_inv, beta, energy, kk) -> np.ndarray:
    n = (len(beta) - 1) // kk
    idx = np.arange(n * kk).reshape(n, kk)
    blocks = g_inv[idx[:, :, None], idx[:, None, :]]            # (n, kk, kk)
    b = beta[idx]                                                # (n, kk, k)
    return np.einsum("nak,nab,nbk->n", b, np.linalg.inv(blocks), b) / energy


def _obs_remove(state, picks) -> None:
    """Remove the channels `picks` (positions among the alive ones) and compensate the rest."""
    g_inv, beta, _, kk = state
    s = (np.asarray(picks)[:, None] * kk + np.arange(kk)).ravel()
    rest = np.setdiff1d(np.arange(len(beta)), s)
    inv_ss = np.linalg.inv(g_inv[np.ix_(s, s)])
    g_rs = g_inv[np.ix_(rest, s)]
    state[1] = beta[rest] - g_rs @ inv_ss @ beta[s]
    state[0] = g_inv[np.ix_(rest, rest)] - g_rs @ inv_ss @ g_rs.T
