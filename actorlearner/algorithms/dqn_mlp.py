"""DQN on a plain MLP Q network: the update with its gradients written out, and the acting forward in numpy.

A Q network over flat observation leaves (vector Boxes, MultiBinary), an MLP torso and one Discrete
branch (every classic control task; board games with an ``action_mask``) is a chain of Linear+ReLU
layers and a (dueling) head over the leaves' concatenated values. On a CPU such a network's step is
bound by dispatching torch ops, not by their arithmetic: autograd, the optimizer's Python and the
per-layer modules cost several times what the matrix products do. `MLPUpdate` runs the same update
(double DQN on the IS-weighted Huber loss, `clip_gradients`, Adam) with the backward pass in closed
form (about half autograd's torch ops), and the parameters in one flat tensor that clipping and Adam each
treat in one operation. The network keeps its modules and state dict.

The dueling head ``Q = V + A - mean(A)`` is linear in its weights, so it is applied as one Linear of
``W = W_A - mean_rows(W_A) + w_V`` (bias alike); its gradient goes back to ``W_A`` and ``w_V`` by the
same map's transpose.

Acting runs a few rows at a time, where each torch op's dispatch costs more than its arithmetic:
`MLPActing` is the same forward in numpy on views of the parameters, in a third to a quarter of the time.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn

from actorlearner.networks import BranchingDuelingHead
from actorlearner.networks.encoders import FlatEncoder
from actorlearner.networks.heads import ILLEGAL_Q


def mlp_layers(network: nn.Module) -> tuple[list[nn.Linear], BranchingDuelingHead] | None:
    """(hidden Linear layers, head) when ``network`` (a `dqn.QNetwork`) is a plain MLP Q network:
    flat leaves only, Linear+ReLU pairs, one action branch (an action mask or not); else None."""
    encoder, head = network.encoder, network.head
    if len(head.sizes) != 1 or any(type(leaf) is not FlatEncoder for leaf in encoder.leaf_encoders):
        return None
    layers = list(encoder.mlp)
    if any(type(layer) is not nn.Linear for layer in layers[0::2]) or any(type(r) is not nn.ReLU for r in layers[1::2]):
        return None
    return layers[0::2], head


class MLPUpdate:
    """One DQN step's gradient on a plain MLP Q network (see `mlp_layers`), for `dqn.DQNTrainer`: the forward
    passes without autograd, the gradients in closed form.

    The online network's parameters become views into one flat Parameter (`flat`), whose ``.grad`` each
    call sets: the trainer clips and steps Adam on that one tensor (a fused step over one tensor instead
    of one per layer), and data-parallel ranks average it as any gradient."""

    def __init__(self, online: nn.Module, target: nn.Module, huber_delta: float):
        self.online, self.online_head = _parts(online)
        self.target, self.target_head = _parts(target)
        self.dueling = online.head.value is not None
        self.leaves = [(key, leaf.output_dim) for key, leaf in zip(online.encoder.keys, online.encoder.leaf_encoders)]
        self.mask_key = online.mask_key
        self.delta = float(huber_delta)
        params = [p for layer in self.online for p in (layer.weight, layer.bias)] + self._head_params(online.head)
        if [id(p) for p in params] != [id(p) for p in online.parameters()]:
            raise ValueError("MLPUpdate: the network's parameters are not in layer order")
        self.flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
        """Every online parameter, in ``online.parameters()`` order, flattened; they are views into it."""
        for param, view in zip(params, self.flat.detach().split([p.numel() for p in params])):
            param.data = view.view_as(param)

    @staticmethod
    def _head_params(head: BranchingDuelingHead) -> list[Tensor]:
        value = [head.value.weight, head.value.bias] if head.value is not None else []
        return [head.advantages.weight, head.advantages.bias, *value]

    def __call__(self, obs: Mapping[str, Tensor], a_tm1: Tensor, r_t: Tensor, discount_t: Tensor,
                 next_obs: Mapping[str, Tensor], weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Set ``flat.grad`` to the loss's gradient; return (loss, |TD| [B], Q of the actions taken [B]).

        ``obs`` and ``next_obs`` are the leaves' tensors as stored, ``a_tm1`` action indices [B, 1],
        ``r_t``, ``discount_t`` and the IS ``weights`` [B]."""
        batch = a_tm1.shape[0]
        with torch.no_grad():
            leaves = [torch.cat((obs[key].reshape(batch, width), next_obs[key].reshape(batch, width)))
                      for key, width in self.leaves]
            x = (leaves[0] if len(leaves) == 1 else torch.cat(leaves, 1)).to(torch.float32)
            hidden, (w, b) = self._torso(self.online, x), _dueling(self.online_head)
            q_both = torch.addmm(b, hidden[-1], w.t())
            tw, tb = _dueling(self.target_head)
            q_t_target = torch.addmm(tb, self._torso(self.target, x[batch:])[-1], tw.t())
            if self.mask_key is not None:  # as `heads.mask_q`: illegal actions' Q values, and their gradients, go
                illegal = torch.cat((obs[self.mask_key], next_obs[self.mask_key])) < 0.5
                q_both.masked_fill_(illegal, ILLEGAL_Q)
                q_t_target.masked_fill_(illegal[batch:], ILLEGAL_Q)
            q_tm1, q_t_online = q_both[:batch], q_both[batch:]
            a_t = q_t_online.argmax(1, keepdim=True)
            target = torch.addcmul(r_t, discount_t, q_t_target.gather(1, a_t).squeeze(1))
            q_taken = q_tm1.gather(1, a_tm1).squeeze(1)
            td = target - q_taken
            td_abs = td.abs()
            quadratic = td_abs.clamp(max=self.delta)  # Huber: q**2 / 2 + delta * (|td| - q), q = min(|td|, delta)
            loss = torch.dot(weights, quadratic * (td_abs - 0.5 * quadratic)) / batch
            # d loss / d q_taken = -w * clamp(td, -delta, delta) / B, on the action taken only
            d_q = torch.zeros_like(q_tm1).scatter_(1, a_tm1, (td.clamp(-self.delta, self.delta) * weights).div_(-batch)
                                                   .unsqueeze(1))
            if self.mask_key is not None:
                d_q.masked_fill_(illegal[:batch], 0.0)
            self._backward(d_q, w, [h[:batch] for h in hidden])
        return loss, td_abs, q_taken

    @staticmethod
    def _torso(layers: list[nn.Linear], x: Tensor) -> list[Tensor]:
        """``x``, then each hidden layer's output (after its ReLU)."""
        outputs = [x]
        for layer in layers:
            outputs.append(torch.addmm(layer.bias, outputs[-1], layer.weight.t()).relu_())
        return outputs

    def _backward(self, d_q: Tensor, w: Tensor, inputs: list[Tensor]) -> None:
        """Set ``flat.grad`` from d loss / d Q [B, N]; ``inputs`` are the observation, then each hidden layer's
        output (the last one the head's input)."""
        grads = []
        d_w, d_b = _outer(d_q, inputs[-1]), d_q.sum(0)
        d_h = d_q.mm(w)
        for i in reversed(range(len(self.online))):
            d_z = torch.ops.aten.threshold_backward(d_h, inputs[i + 1], 0)  # through the ReLU (autograd's own op)
            grads += [d_z.sum(0), _outer(d_z, inputs[i])]
            if i:
                d_h = d_z.mm(self.online[i].weight)
        grads.reverse()  # weight, bias per layer, from the first
        if self.dueling:  # W = W_A - mean_rows(W_A) + w_V: back through the map's transpose
            grads += [d_w - d_w.mean(0), d_b - d_b.mean(), d_w.sum(0, keepdim=True), d_b.sum(0, keepdim=True)]
        else:
            grads += [d_w, d_b]
        self.flat.grad = torch.cat([grad.reshape(-1) for grad in grads])


SINGLE_THREAD_PRODUCT = 2**18
"""Multiply-adds (rows x inputs x outputs) up to which numpy's BLAS (OpenBLAS) runs a matrix product on one
thread. Past it the product is split over threads, which on a busy machine takes several times longer, and the
threads spin on the cores the other processes need; torch keeps to the process's thread count."""


class MLPActing:
    """A plain MLP Q network's forward (see `mlp_layers`) in numpy, for acting on the CPU on at most `max_rows`
    rows. Its arrays are views of the network's parameters, so it follows weights loaded into them
    (`load_state_dict` copies in place)."""

    def __init__(self, network: nn.Module):
        layers, head = _parts(network)
        self.layers = [_transposed(layer) for layer in layers]
        self.advantages = _transposed(head.advantages)
        self.value = _transposed(head.value) if head.value is not None else None
        self.max_rows = SINGLE_THREAD_PRODUCT // max(weight_t.size for weight_t, _ in [*self.layers, self.advantages])
        """The most rows whose every product stays on one thread (16 for (128, 128) layers; 0 for a wide network)."""
        self._inverse_actions = np.float32(1 / head.advantages.out_features)
        self.leaves = [(key, leaf.output_dim) for key, leaf in zip(network.encoder.keys, network.encoder.leaf_encoders)]
        self.mask_key = network.mask_key

    def __call__(self, leaves: Mapping[str, np.ndarray]) -> np.ndarray:
        """Q values [E, 1, N] of the observation leaves [E, ...] (as `leaf_splitter` gives them); an action mask's
        illegal actions get `ILLEGAL_Q`, as `heads.mask_q` gives them."""
        rows = len(leaves[self.leaves[0][0]])
        parts = [leaves[key].reshape(rows, width) for key, width in self.leaves]
        h = (parts[0] if len(parts) == 1 else np.concatenate(parts, 1)).astype(np.float32, copy=False)
        for weight_t, bias in self.layers:
            h = h @ weight_t
            h += bias
            np.maximum(h, 0, out=h)
        q = h @ self.advantages[0]
        q += self.advantages[1]
        if self.value is not None:  # Q = A + (V - mean(A)); a sum's reduction costs a fraction of ndarray.mean's
            q += h @ self.value[0] + self.value[1] - q.sum(1, keepdims=True) * self._inverse_actions
        if self.mask_key is not None:
            np.putmask(q, leaves[self.mask_key] < 0.5, ILLEGAL_Q)
        return q[:, None, :]


def _transposed(layer: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    """A Linear's (weight^T [in, out], bias [out]) as numpy views of its parameters."""
    return layer.weight.detach().numpy().T, layer.bias.detach().numpy()


def _outer(d_out: Tensor, inputs: Tensor) -> Tensor:
    """A Linear's weight gradient d_out^T @ inputs [out, in], in the order MKL runs faster for its shape
    (a narrow input's as (inputs^T @ d_out)^T: a third of the time for CartPole's 4 features)."""
    return inputs.t().mm(d_out).t() if inputs.shape[1] < d_out.shape[1] else d_out.t().mm(inputs)


def _parts(network: nn.Module) -> tuple[list[nn.Linear], BranchingDuelingHead]:
    parts = mlp_layers(network)
    if parts is None:
        raise ValueError("MLPUpdate takes a plain MLP Q network (see mlp_layers)")
    return parts


def _dueling(head: BranchingDuelingHead) -> tuple[Tensor, Tensor]:
    """The head as one Linear's (weight [N, H], bias [N]): Q = V + A - mean(A) folded into A's layer."""
    w, b = head.advantages.weight, head.advantages.bias
    if head.value is None:
        return w, b
    return w - w.mean(0) + head.value.weight, b - b.mean() + head.value.bias

