"""1F1B pipeline schedule, one pipeline per replica index.

Each pipeline k runs its own microbatch size and count (the plan's
`pipelines[k]`), so faster GPUs take more samples; megatron-core's schedules
assume one microbatch size for all, hence this one. Stage s of S first runs
min(S - s - 1, n) forward passes (warm-up), then alternates one forward and
one backward (steady state), then drains the remaining backward passes
(cool-down), as in Megatron's non-interleaved schedule. Activations in
flight: at most S - s microbatches.

Each microbatch's loss is the sum of its token losses divided by the number
of tokens in the *global* batch, so the gradients summed over all
microbatches of all pipelines are exactly the gradient of the global batch's
mean token loss. With fp16 the loss is multiplied by `loss_scale` before its
backward pass (precision.LossScaler); the loss returned is unscaled. A MoE
block's router losses take the same scale, over the global batch's sequences
or tokens (sailor_ext/moe.py).

The model computes in its parameters' dtype (precision.py casts the whole
stage), so activations and their gradients arrive and leave in that dtype.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from sailor_ext.loss import vocab_parallel_cross_entropy
from sailor_ext.model import StageModel
from sailor_ext.p2p import StageLinks
from sailor_ext.topology import Topology


@dataclass(frozen=True)
class PipelineShape:
    """What one pipeline runs per step."""

    microbatch_size: int
    num_microbatches: int
    seq_len: int
    hidden: int
    global_tokens: int  # tokens in the global batch: the loss denominator

    @property
    def global_sequences(self) -> int:
        return self.global_tokens // self.seq_len

    @property
    def activation(self) -> torch.Size:
        return torch.Size((self.seq_len, self.microbatch_size, self.hidden))


class OneFOneB:
    def __init__(self, model: StageModel, links: StageLinks, topology: Topology, shape: PipelineShape):
        self.model, self.links, self.topology, self.shape = model, links, topology, shape
        self.loss_scale = 1.0  # fp16: set by the trainer before each step

    def _forward(self, x: torch.Tensor | None, tokens: torch.Tensor | None):
        """Returns (stage input to keep, stage output, loss sum or None)."""
        first, last = self.topology.is_first_stage, self.topology.is_last_stage
        if first:
            inputs = tokens[:, :-1]
        else:
            x.requires_grad_()
            inputs = x
        out = self.model(inputs)
        if not last:
            return x, out, None
        labels = tokens[:, 1:].t()  # [s, b], matching the logits' [s, b, V/tp]
        token_loss = vocab_parallel_cross_entropy(out, labels, self.model.vocab_start, self.model.tp_group,
                                                  self.model.spec.model.vocab)
        loss = token_loss.sum() / self.shape.global_tokens
        return x, (loss * self.loss_scale if self.loss_scale != 1.0 else loss), loss.detach()

    def _backward(self, x: torch.Tensor | None, out: torch.Tensor, grad: torch.Tensor | None):
        if grad is None:
            out.backward()
        else:
            out.backward(grad.to(out.dtype))
        return None if x is None else x.grad

    def forward_only(self, microbatches: list[torch.Tensor | None]) -> torch.Tensor:
        """Forward passes alone (validation): this rank's loss sum, as run() counts it.

        Every stage receives, computes and sends on microbatch by microbatch,
        the warm-up's pattern; no graph is built and nothing is kept.
        """
        first = self.topology.is_first_stage
        loss_sum = torch.zeros((), device=self.topology.device)
        with torch.no_grad():
            for tokens in microbatches:
                x = None if first else self.links.exchange(recv_prev=self.shape.activation)[0]
                _, out, loss = self._forward(x, tokens)
                if loss is None:
                    self.links.exchange(send_next=out)
                else:
                    loss_sum += loss.float()
        return loss_sum

    def run(self, microbatches: list[torch.Tensor | None]) -> torch.Tensor:
        """One step's forward and backward passes; returns this rank's loss sum.

        microbatches[i]: tokens [mbs, seq + 1] of microbatch i on the first and
        the last stage (input and labels), None elsewhere.
        """
        stage, stages = self.topology.stage, self.topology.num_stages
        first, last = self.topology.is_first_stage, self.topology.is_last_stage
        n, act = self.shape.num_microbatches, self.shape.activation
        warmup = min(stages - stage - 1, n)
        steady = n - warmup
        links = self.links
        inflight: deque = deque()
        loss_sum = torch.zeros((), device=self.topology.device)
        for moe in self.model.moe_layers:  # the router losses' normalisers and scale, as the token losses'
            moe.start_step(self.loss_scale, self.shape.global_sequences, self.shape.global_tokens)

        def recv_forward():
            return None if first else links.exchange(recv_prev=act)[0]

        def forward(i, x):
            nonlocal loss_sum
            kept, out, loss = self._forward(x, microbatches[i])
            if loss is not None:
                loss_sum = loss_sum + loss.float()
            inflight.append((kept, out))
            return out

        def backward(grad):
            kept, out = inflight.popleft()
            return self._backward(kept, out, grad)

        for i in range(warmup):
            out = forward(i, recv_forward())
            links.exchange(send_next=out)
        x = recv_forward() if steady else None
        for j in range(steady):
            out = forward(warmup + j, x)
            grad = None if last else links.exchange(send_next=out, recv_next=act)[1]
            grad_in = backward(grad)
            if j == steady - 1:
                x = None
                if not first:
                    links.exchange(send_prev=grad_in)
            elif not first:
                x = links.exchange(send_prev=grad_in, recv_prev=act)[0]
        for _ in range(warmup):
            grad = links.exchange(recv_next=act)[1]
            grad_in = backward(grad)
            if not first:
                links.exchange(send_prev=grad_in)
        return loss_sum
