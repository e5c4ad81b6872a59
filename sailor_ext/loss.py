"""Cross entropy over vocabulary-parallel logits, with an explicit TP group.

megatron-core's `vocab_parallel_cross_entropy` looks up the global TP group,
which does not exist here (each (stage, replica) has its own), so the loss is
computed outside the model. Each TP rank holds logits for a contiguous slice
of the (padded) vocabulary; three all-reduces over the TP group give the
max, the target logit and the softmax denominator.

Columns beyond the real vocabulary (Megatron's padding to a multiple of
128 * tp) are not tokens: their logits are masked out, so the loss is the
one over the tokenizer's vocabulary (as transformers computes it) and the
padding rows get no gradient.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab_start: int, group, vocab_size: int | None):
        logits = logits.float()
        padding = logits.size(-1) - (vocab_size - vocab_start) if vocab_size is not None else 0
        if padding > 0:
            logits = logits.clone()
            logits[..., max(0, logits.size(-1) - padding):] = float("-inf")
        parallel = group is not None and group.size() > 1
        logits_max = logits.max(dim=-1).values
        if parallel:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - logits_max.unsqueeze(-1)

        local_vocab = logits.size(-1)
        local_target = target - vocab_start
        outside = (local_target < 0) | (local_target >= local_vocab)
        local_target = local_target.masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(outside, 0.0)

        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        if parallel:
            both = torch.stack([target_logit, sum_exp])
            dist.all_reduce(both, group=group)
            target_logit, sum_exp = both[0], both[1]
        loss = sum_exp.log() - target_logit

        exp.div_(sum_exp.unsqueeze(-1))  # softmax, kept for backward
        ctx.save_for_backward(exp, local_target, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, outside = ctx.saved_tensors
        grad = softmax
        hit = (~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -hit.unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                                 group: dist.ProcessGroup | None, vocab_size: int | None = None) -> torch.Tensor:
    """Per-token loss [s, b] from logits [s, b, V/tp] whose slice starts at vocab_start;
    columns from `vocab_size` on (padding) are excluded."""
    return _VocabParallelCrossEntropy.apply(logits, target, vocab_start, group, vocab_size)
