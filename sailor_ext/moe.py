"""A block's mixture-of-experts MLP (Mixtral, Qwen2/3-MoE, OLMoE, gpt-oss, DeepSeek), sharded over the TP group.

A router (a linear hidden -> E experts, with a bias in gpt-oss) scores each token; the softmax of its scores, in
fp32, picks the k experts of highest probability, and the token's output is the sum of those
experts' outputs weighted by their probabilities (renormalised to sum to 1 where the model says
so: ModelSpec.expert_renorm). Each expert is an MLP like a dense block's (SwiGLU or plain, no
biases; gpt-oss's clamped GLU with biases, ModelSpec.glu_limit). Qwen2-MoE adds a shared expert that
every token passes through, its output scaled by sigmoid(x . w_gate), a replicated linear hidden -> 1;
GraniteMoeShared's and DeepSeek's are added without a gate. DeepSeek-V3 scores with sigmoids, chooses by
scores plus a fixed bias per expert among the best groups of experts (_sigmoid_route); DeepSeek-V2 chooses
among the groups of the highest probabilities; both scale the chosen weights. Llama 4 scores with sigmoids
and weighs each chosen expert's input, not its output (ModelSpec.expert_input_weighted).

Tensor parallelism is Megatron's expert tensor parallelism at the TP degree, without expert
parallelism: every TP rank holds every expert, and of each its slice of fc1's rows ([gate; up] of
its rows with SwiGLU) and of fc2's columns, as a dense MLP's column- and row-parallel linears. A
rank computes the partial outputs of every expert for the tokens routed to it and their weighted
sum, which one all-reduce completes, as a dense fc2's.

The router (and the shared expert's gate) is replicated: every rank routes the same input with the
same weight, so all route alike. In backward each rank's routing gradient covers its own partial
outputs only, so the router weight's gradient is the sum over the TP ranks
(ParamShard.partial_grad), and the gradient the router sends to its input is summed by the
all-reduce that the experts' input takes in backward anyway (copy_to_tensor_model_parallel_region),
the router reading that same input.

Two router losses, each off by default, join the objective, per MoE block:

  * load balancing (--moe-aux-loss-coeff c): for each sequence of the global batch, c / B times its
    balance E / (s k) * sum_e n_e P_e (1 when routing is even), with B the global batch in
    sequences, s tokens per sequence, n_e the (token, slot) pairs routed to expert e and P_e its mean
    router probability over the sequence's tokens; only P_e carries a gradient. (A sigmoid router's
    probabilities are its scores normalised per token, and n_e counts each token's top k of them, as
    DeepSeek-V3's sequence-wise loss and Megatron-LM have it.) This is Megatron-LM's
    seq_aux_loss, and for one sequence and one block transformers' load-balancing loss divided by k.
    Per sequence, it is the same loss under every plan, whatever the microbatching; transformers' own
    (output_router_logits) pools all blocks and the whole batch, which no pipeline of microbatches
    computes, so families/moe.py refuses it and points here.
  * z-loss (--moe-z-loss-coeff c): for each token of the global batch, c / T times the square of the
    logsumexp of its router logits (ST-MoE; Megatron-LM's --moe-z-loss-coeff), T the global batch in
    tokens: it keeps the logits small.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sailor_ext import compat  # noqa: F401  (installs warning filters before megatron imports)
from megatron.core.tensor_parallel.mappings import (  # noqa: E402
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)

from planner.specs.model import ModelSpec  # noqa: E402


class ExpertWeights(nn.Module):
    """One weight of every expert, stacked: logical [E, ...], this rank's slice along
    `partition_dim` (fc1 [E, 2, ffn, h] with SwiGLU or [E, ffn, h], split along ffn; fc2
    [E, h, ffn], split along its last dimension); the shared expert's without the E. With biases
    (gpt-oss): fc1's [E, 2, ffn] or [E, ffn], split along ffn as its rows; fc2's [E, h], replicated
    (bias_dim None) and added by TP rank 0 alone, to its partial output before the all-reduce: its
    weighting by the router must reach the router's gradient once, which the TP group sums
    (ParamShard.partial_grad, the bias's gradient too)."""

    def __init__(self, logical_shape: tuple[int, ...], partition_dim: int, tp: int,
                 bias_shape: tuple[int, ...] = (), bias_dim: int | None = None):
        super().__init__()
        self.logical_shape, self.partition_dim = tuple(logical_shape), partition_dim
        self.bias_shape, self.bias_dim = tuple(bias_shape), bias_dim
        # built on the CPU as megatron's layers are (use_cpu_initialization); the stage moves it to its device
        cpu = torch.device("cpu")
        self.weight = nn.Parameter(torch.empty(self.local_shape(logical_shape, partition_dim, tp), device=cpu))
        if bias_shape:
            self.bias = nn.Parameter(torch.empty(self.local_shape(bias_shape, bias_dim, tp), device=cpu))

    @staticmethod
    def local_shape(shape: tuple[int, ...], dim: int | None, tp: int) -> list[int]:
        local = list(shape)
        if dim is not None:
            local[dim] //= tp
        return local


class _RouterLossGradient(torch.autograd.Function):
    """The identity on a MoE block's output, through which the router losses join backward.

    They are no stage's output, so no stage's loss would carry their gradient: backward starts it here,
    with d(objective)/d(loss) = moe.grad_scale, and adds the microbatch's sums (balances, z) to
    moe.router_sums and its tokens per expert to moe.expert_load (when counted), once per microbatch (a
    forward that activation recomputation reruns in backward builds a node whose backward never runs)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, loss: torch.Tensor, sums: torch.Tensor, loads: torch.Tensor | None,
                moe: "MoE") -> torch.Tensor:
        ctx.moe, ctx.sums, ctx.loads = moe, sums, loads
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        moe = ctx.moe
        moe.router_sums = moe.router_sums + ctx.sums  # stays on the device
        if ctx.loads is not None:
            moe.expert_load = moe.expert_load + ctx.loads
        return grad, torch.full((), moe.grad_scale, dtype=torch.float32, device=grad.device), None, None, None


def updated_score_bias(bias: torch.Tensor, loads: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's auxiliary-loss-free balancing: each expert's score bias moves by `rate` toward an even
    load, b_e + rate * sign(mean_e' n_e' - n_e), n the tokens each expert took over the global batch (an
    expert above the mean becomes less likely to be chosen). Megatron-LM's --moe-router-bias-update-rate."""
    return (bias.double() + rate * torch.sign(loads.double().mean() - loads.double())).to(bias.dtype)


def sequence_balance(probs: torch.Tensor, chosen: torch.Tensor, batch: int) -> torch.Tensor:
    """Each sequence's balance E / (s k) * sum_e n_e P_e [b] from the router's probabilities [s * b, E]
    (fp32) and chosen experts [s * b, k] of tokens in [s, b] order (token t is of sequence t mod b)."""
    tokens, experts = probs.shape
    seq, k = tokens // batch, chosen.size(1)
    sequence = torch.arange(tokens, device=chosen.device).remainder(batch)
    counts = torch.zeros(batch * experts, device=probs.device, dtype=probs.dtype)
    counts.scatter_add_(0, (sequence[:, None] * experts + chosen).flatten(),
                        torch.ones(chosen.numel(), device=probs.device, dtype=probs.dtype))
    mean_probs = probs.view(seq, batch, experts).mean(dim=0)  # P_e per sequence [b, E]
    return (counts.view(batch, experts) * mean_probs).sum(dim=-1) * (experts / (seq * k))


class MoE(nn.Module):
    """forward(x [s, b, h]) -> (output [s, b, h], None), as megatron's MLP returns (output, bias)."""

    def __init__(self, model: ModelSpec, tp: int, tp_group, activation, aux_loss_coeff: float = 0.0,
                 z_loss_coeff: float = 0.0, tp_rank: int = 0, count_loads: bool = False):
        """count_loads: count the tokens each expert takes (expert_load; for updated_score_bias)."""
        super().__init__()
        # router losses: their coefficients; the step's global batch and gradient scale (start_step); the
        # step's sums of sequence balances and token z values and its tokens per expert (float64, [E]), read and
        # reset by the trainer
        self.aux_loss_coeff, self.z_loss_coeff, self.tp, self.tp_rank = aux_loss_coeff, z_loss_coeff, tp, tp_rank
        self.count_loads = count_loads
        self.sequences = self.tokens = 1
        self.grad_scale = 0.0
        self.router_sums: torch.Tensor | float = 0.0
        self.expert_load: torch.Tensor | float = 0.0
        experts, h, f = model.experts, model.hidden, model.ffn_hidden
        self.top_k, self.renorm, self.gated = model.experts_per_token, model.expert_renorm, model.gated_mlp
        self.glu_limit, self.glu_alpha = model.glu_limit, model.glu_alpha
        self.activation, self.tp_group = activation, tp_group
        self.router = nn.Linear(h, experts, bias=model.router_bias)
        self.sigmoid, self.groups, self.groups_per_token = model.router_sigmoid, model.expert_groups, \
            model.expert_groups_per_token
        self.routed_scale, self.input_weighted = model.routed_scale, model.expert_input_weighted
        if model.expert_score_bias:  # fixed: it only chooses, so no gradient reaches it (as transformers' buffer)
            self.router.score_bias = nn.Parameter(torch.zeros(experts, device=torch.device("cpu")))
        self.router_fp32 = model.router_fp32
        for param in self.router.parameters():  # (precision.MainParams keeps these fp32 in a bf16/fp16 model)
            param.sailor_fp32 = model.router_fp32
        fc1 = (experts, 2, f, h) if self.gated else (experts, f, h)
        self.linear_fc1 = ExpertWeights(fc1, len(fc1) - 2, tp, fc1[:-1] if model.mlp_bias else (), len(fc1) - 2)
        self.linear_fc2 = ExpertWeights((experts, h, f), 2, tp, (experts, h) if model.mlp_bias else ())
        if model.shared_expert_ffn:
            fs = model.shared_expert_ffn
            self.shared_expert = nn.Module()
            self.shared_expert.linear_fc1 = ExpertWeights((2, fs, h) if self.gated else (fs, h), int(self.gated), tp)
            self.shared_expert.linear_fc2 = ExpertWeights((h, fs), 1, tp)
            if model.shared_expert_gated:
                self.shared_gate = nn.Linear(h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        shape = x.shape
        # [tokens, h]; backward all-reduces the gradient the router and the experts send to it
        x = copy_to_tensor_model_parallel_region(x.reshape(-1, shape[-1]), group=self.tp_group)
        logits = self.router_logits(x)
        # [tokens, k] fp32 weights and experts, and the [tokens, E] probabilities (a sigmoid router's scores)
        weights, chosen, probs = (self._sigmoid_route if self.sigmoid else self._softmax_route)(logits)
        losses = self._router_losses(logits, probs, chosen, shape[1]) \
            if (self.aux_loss_coeff or self.z_loss_coeff or self.count_loads) and torch.is_grad_enabled() else None
        if self.renorm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if self.sigmoid else 0.0))
        if self.routed_scale != 1:
            weights = weights * self.routed_scale
        # the (token, slot) pairs grouped by expert, experts in order (transformers' order of summation)
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.router.out_features).tolist()
        weights = weights.flatten()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            picks = order[start:start + count]
            start += count
            tokens = picks // self.top_k
            fc1_bias = self.linear_fc1.bias[expert] if hasattr(self.linear_fc1, "bias") else None
            if self.input_weighted:  # Llama 4: the expert's input weighted (in its dtype), its output as it is
                y = self._mlp(x[tokens] * weights[picks, None].to(x.dtype), self.linear_fc1.weight[expert],
                              self.linear_fc2.weight[expert], fc1_bias)
            else:
                y = self._mlp(x[tokens], self.linear_fc1.weight[expert], self.linear_fc2.weight[expert], fc1_bias)
                y = y * weights[picks, None]
            out.index_add_(0, tokens, y.to(out.dtype))
        if hasattr(self, "shared_expert"):
            shared = self._mlp(x, self.shared_expert.linear_fc1.weight, self.shared_expert.linear_fc2.weight)
            out = out + (torch.sigmoid(F.linear(x, self.shared_gate.weight)) * shared if hasattr(self, "shared_gate")
                         else shared)
        if hasattr(self.linear_fc2, "bias") and self.tp_rank == 0:  # fc2's biases, once: sum_k w_k b_(e_k)
            out = out + (weights.view(-1, self.top_k, 1) * self.linear_fc2.bias[chosen]).sum(dim=1).to(out.dtype)
        out = reduce_from_tensor_model_parallel_region(out, group=self.tp_group)
        if losses is not None:
            loads = torch.tensor(counts, dtype=torch.float64, device=x.device) if self.count_loads else None
            out = _RouterLossGradient.apply(out, *losses, loads, self)
        return out.view(shape), None

    def router_logits(self, x: torch.Tensor) -> torch.Tensor:
        """[tokens, E] fp32 logits: of fp32 inputs and weights with router_fp32, else in the model's dtype."""
        if self.router_fp32:
            bias = None if self.router.bias is None else self.router.bias.float()
            return F.linear(x.float(), self.router.weight.float(), bias)
        return F.linear(x, self.router.weight, self.router.bias).float()

    def _softmax_route(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The top k of the softmax probabilities (DeepSeek-V2's group-limited routing: among the groups_per_token
        groups whose best probability is highest; ERNIE 4.5's: chosen by the probabilities plus the fixed score
        bias, weighed by the probabilities). Returns (weights, chosen [tokens, k], the probabilities)."""
        probs = torch.softmax(logits, dim=-1)
        if hasattr(self.router, "score_bias"):
            chosen = torch.topk(probs + self.router.score_bias.float(), self.top_k, dim=-1).indices
            return probs.gather(1, chosen), chosen, probs
        if self.groups > 1:
            weights, chosen = torch.topk(self._best_groups(probs, probs.view(probs.size(0), self.groups, -1)
                                                           .amax(dim=-1), 0.0), self.top_k, dim=-1)
        else:
            weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        return weights, chosen, probs

    def _sigmoid_route(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """DeepSeek-V3's routing: scores sigmoid(logits); the experts chosen by scores + the fixed score bias,
        among the groups_per_token groups whose two best biased scores sum highest; each chosen expert weighed
        by its unbiased score. Returns (weights, chosen [tokens, k], the scores)."""
        scores = torch.sigmoid(logits)
        choice = scores + self.router.score_bias.float() if hasattr(self.router, "score_bias") else scores
        if self.groups > 1:
            group_scores = choice.view(choice.size(0), self.groups, -1).topk(2, dim=-1).values.sum(dim=-1)
            choice = self._best_groups(choice, group_scores, float("-inf"))
        chosen = torch.topk(choice, self.top_k, dim=-1).indices
        return scores.gather(1, chosen), chosen, scores

    def balance_reads(self, probs: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the balancing loss reads of a routing (probabilities [tokens, E], chosen [tokens, k]), as
        DeepSeek-V3's sequence-wise loss and Megatron-LM define it: a sigmoid router's scores normalised to sum
        to 1 per token; with a sigmoid router, expert groups or score biases, each token's top k of those, unbiased
        and ungrouped, in place of the experts chosen."""
        if self.sigmoid:
            probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20)
        if self.sigmoid or self.groups > 1 or hasattr(self.router, "score_bias"):
            chosen = torch.topk(probs, self.top_k, dim=-1).indices
        return probs, chosen

    def _best_groups(self, scores: torch.Tensor, group_scores: torch.Tensor, fill: float) -> torch.Tensor:
        """scores [tokens, E] with those outside each token's groups_per_token best groups (by group_scores
        [tokens, groups]) set to `fill`."""
        best = torch.topk(group_scores, self.groups_per_token, dim=-1).indices
        kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        grouped = scores.view(scores.size(0), self.groups, -1)
        return grouped.masked_fill(~kept.unsqueeze(-1), fill).view_as(scores)

    def start_step(self, loss_scale: float, sequences: int, tokens: int) -> None:
        """The step's global batch (B sequences, T tokens) and loss scale. Every TP rank computes the same
        router losses, and the router's weight gradient and its input's are summed over the TP group
        (ParamShard.partial_grad; the input's all-reduce), so each rank carries 1/tp of them."""
        self.sequences, self.tokens, self.grad_scale = sequences, tokens, loss_scale / self.tp

    def _router_losses(self, logits, probs, chosen, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The microbatch's router loss c_aux / B * sum of balances + c_z / T * sum of z, and the two sums."""
        zero = logits.new_zeros(())
        balance = sequence_balance(*self.balance_reads(probs, chosen), batch).sum() if self.aux_loss_coeff else zero
        z = torch.logsumexp(logits, dim=-1).square().sum() if self.z_loss_coeff else zero
        loss = self.aux_loss_coeff / self.sequences * balance + self.z_loss_coeff / self.tokens * z
        return loss, torch.stack([balance, z]).detach().double()

    def _mlp(self, x: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor, fc1_bias: torch.Tensor | None = None) \
            -> torch.Tensor:
        """This rank's partial output of one expert (its fc1 and fc2 slices) for its tokens x [n, h]."""
        hidden = F.linear(x, fc1.reshape(-1, fc1.size(-1)), None if fc1_bias is None else fc1_bias.reshape(-1))
        if self.gated and self.glu_limit:  # gpt-oss's clamped GLU (ModelSpec.glu_limit)
            gate, up = hidden.chunk(2, dim=-1)
            gate, up = gate.clamp(max=self.glu_limit), up.clamp(-self.glu_limit, self.glu_limit)
            hidden = gate * torch.sigmoid(gate * self.glu_alpha) * (up + 1)
        elif self.gated:
            gate, up = hidden.chunk(2, dim=-1)
            hidden = self.activation(gate) * up
        else:
            hidden = self.activation(hidden)
        return F.linear(hidden, fc2)
