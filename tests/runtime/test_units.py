"""In-process checks of the runtime's pieces (one gloo rank, no subprocesses)."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _runtime_helpers import free_port

from planner.launch import rank_layout, uniform_plan
from planner.specs.model import get_model
from planner.specs.plan import Pipeline, Plan, Replica, Stage


@pytest.fixture(scope="module")
def world_of_one():
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield


def test_boundary_sends_every_chunk_once():
    from sailor_ext.p2p import Boundary

    for a in (1, 2, 4, 8):
        for b in (1, 2, 4, 8):
            senders, receivers = tuple(range(a)), tuple(range(100, 100 + b))
            boundary = Boundary(senders, receivers)
            sent = [(c, dst, src) for src in senders for c, dst in boundary.sends(src)]
            received = [(c, dst, src) for dst in receivers for c, src in boundary.recvs(dst)]
            assert sorted(sent) == sorted(received)  # every send has its matching receive
            assert sorted(c for c, _, _ in sent) == list(range(max(a, b)))  # each chunk crosses once
            pairs = [(src, dst) for _, dst, src in sent]
            assert len(pairs) == len(set(pairs))  # at most one message per pair: no ordering ambiguity


def test_resharded_tensor_is_reassembled_in_order():
    """Emulate a boundary end to end: chunk, send per Boundary.sends, collect
    per Boundary.recvs, all-gather (concatenate by receiver), reassemble."""
    from sailor_ext.p2p import Boundary, _flat_chunks, reassemble

    tensor = torch.arange(2 * 3 * 40.0).view(2, 3, 40)
    for a in (1, 2, 4, 8):
        for b in (1, 2, 4, 8):
            boundary = Boundary(tuple(range(a)), tuple(range(100, 100 + b)))
            chunks = _flat_chunks(tensor, boundary.num_chunks)
            inbox = {(c, dst): chunks[c] for src in range(a) for c, dst in boundary.sends(src)}
            held = [torch.stack([inbox[(c, dst)] for c, _ in boundary.recvs(dst)]) for dst in boundary.receivers]
            whole = reassemble(torch.cat([h.reshape(-1) for h in held]), b, boundary.num_chunks)
            assert torch.equal(whole[: tensor.numel()].view_as(tensor), tensor), (a, b)


def test_param_shard_chunks_tile_the_logical_tensor():
    from sailor_ext.sharding import ParamShard

    full = torch.arange(8 * 3.0).view(8, 3)
    for tp in (1, 2, 4):
        pieces = []
        for rank in range(tp):
            shard = ParamShard("w", (8, 3), 0, tp, rank, num_chunks=4, stages=(0,))
            local = shard.shard_of(full)
            assert tuple(local.shape) == shard.local_shape
            for c in shard.local_chunks:
                lo, hi = shard.chunk_range(c)
                assert torch.equal(shard.chunk_view(local, c), full[lo:hi])
                pieces.append(c)
        assert sorted(pieces) == [0, 1, 2, 3]


@pytest.mark.parametrize("pipelines", [[(12, 1)], [(4, 1), (2, 3), (1, 2)], [(2, 4), (1, 4)]])
def test_every_sample_used_once_per_step(pipelines):
    from sailor_ext.data import BatchSlicer

    plan = Plan("tiny", 12, (Stage(0, 5, (Replica("CPU", 1, "z"),) * len(pipelines)),),
                tuple(Pipeline(m, n) for m, n in pipelines))
    slicer = BatchSlicer(plan)
    for step in range(3):
        used = [i for k, p in enumerate(plan.pipelines) for m in range(p.num_microbatches)
                for i in slicer.microbatch(step * 12, k, m)]
        assert sorted(used) == list(range(step * 12, step * 12 + 12))


def test_synthetic_samples_are_deterministic():
    from sailor_ext.data import SyntheticTokens

    syn = SyntheticTokens(512, 16, seed=3)
    assert np.array_equal(syn.sample(9), SyntheticTokens(512, 16, seed=3).sample(9))
    assert not np.array_equal(syn.sample(9), SyntheticTokens(512, 16, seed=4).sample(9))
    assert not np.array_equal(syn.sample(9), SyntheticTokens(512, 16, seed=3, stream=1).sample(9))  # validation


def test_vocab_parallel_cross_entropy_matches_torch(world_of_one):
    from sailor_ext.loss import vocab_parallel_cross_entropy

    torch.manual_seed(0)
    logits = torch.randn(5, 3, 40, requires_grad=True)
    target = torch.randint(0, 40, (5, 3))
    ours = vocab_parallel_cross_entropy(logits, target, 0, dist.new_group([0]))
    ours.sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref = F.cross_entropy(logits.view(-1, 40), target.view(-1), reduction="none").view(5, 3)
    ref.sum().backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad, logits.grad)


def _plain_gpt_loss(weights: dict[str, torch.Tensor], tokens: torch.Tensor, model) -> torch.Tensor:
    """The same decoder written in plain torch from the logical weights (the
    layout megatron uses: QKV rows grouped per head as [q, k, v])."""
    h, heads = model.hidden, model.heads
    hd = h // heads
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    b, s = inputs.shape
    x = weights["layers.0.word_embeddings.weight"][inputs] + weights["layers.0.position_embeddings.weight"][:s]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    for layer in range(1, model.num_blocks + 1):
        w = {k.split(".", 2)[2]: v for k, v in weights.items() if k.startswith(f"layers.{layer}.")}
        y = F.layer_norm(x, (h,), w["input_layernorm.weight"], w["input_layernorm.bias"])
        qkv = (y @ w["self_attention.linear_qkv.weight"].t() + w["self_attention.linear_qkv.bias"])
        q, k, v = qkv.view(b, s, heads, 3 * hd).split(hd, dim=-1)
        scores = torch.einsum("bqnd,bknd->bnqk", q, k) / math.sqrt(hd)
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        ctx = torch.einsum("bnqk,bknd->bqnd", probs, v).reshape(b, s, h)
        x = x + ctx @ w["self_attention.linear_proj.weight"].t() + w["self_attention.linear_proj.bias"]
        y = F.layer_norm(x, (h,), w["pre_mlp_layernorm.weight"], w["pre_mlp_layernorm.bias"])
        y = F.gelu(y @ w["mlp.linear_fc1.weight"].t() + w["mlp.linear_fc1.bias"])
        x = x + y @ w["mlp.linear_fc2.weight"].t() + w["mlp.linear_fc2.bias"]
    head = f"layers.{model.num_blocks + 1}"
    x = F.layer_norm(x, (h,), weights[f"{head}.final_layernorm.weight"], weights[f"{head}.final_layernorm.bias"])
    logits = x @ weights[f"{head}.output_layer.weight"].t()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def test_stage_model_is_the_plain_gpt(world_of_one):
    """The megatron-built model (one stage, TP 1) computes the same loss and
    gradients as a plain-torch GPT given the same logical weights."""
    from sailor_ext import compat
    from sailor_ext.data import SyntheticTokens
    from sailor_ext.loss import vocab_parallel_cross_entropy
    from sailor_ext.model import StageModel, StageSpec, init_from_seed
    from sailor_ext.topology import Topology

    model = get_model("tiny", seq_len=16)
    plan = uniform_plan(model, 1, 1, 1, 4, 4)
    topo = Topology(rank_layout(plan), 0, torch.device("cpu"))
    compat.install(torch.device("cpu"), 1, 0)
    stage = StageModel(StageSpec(model, 0, model.num_layers - 1, 1, 0, model.padded_vocab(1)), topo.tp_group,
                       torch.device("cpu"))
    init_from_seed(stage, seed=11)
    source = SyntheticTokens(model.vocab, model.seq_len, seed=5)
    tokens = torch.from_numpy(np.stack([source.sample(i) for i in range(4)]))

    logits = stage(tokens[:, :-1])
    loss = vocab_parallel_cross_entropy(logits, tokens[:, 1:].t(), 0, topo.tp_group).mean()
    loss.backward()

    weights = {stage.shards[n].name: p.detach().clone().requires_grad_() for n, p in stage.named_parameters()}
    ref = _plain_gpt_loss(weights, tokens, model)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=0)
    for name, param in stage.named_parameters():
        torch.testing.assert_close(param.grad, weights[stage.shards[name].name].grad, rtol=1e-4, atol=1e-7,
                                   msg=lambda m: f"{name}: {m}")


def test_recompute_reruns_blocks_and_keeps_less(world_of_one):
    """With recompute every block runs its forward twice per step and the forward keeps fewer
    tensors for backward; the gradients are the same."""
    from sailor_ext import compat
    from sailor_ext.model import StageModel, StageSpec, init_from_seed
    from sailor_ext.topology import Topology

    model = get_model("tiny", seq_len=16)
    topo = Topology(rank_layout(uniform_plan(model, 1, 1, 1, 4, 4)), 0, torch.device("cpu"))
    compat.install(torch.device("cpu"), 1, 0)
    tokens = torch.randint(0, model.vocab, (4, 16))
    results = {}
    for recompute in (False, True):
        spec = StageSpec(model, 0, model.num_layers - 1, 1, 0, model.padded_vocab(1), recompute=recompute)
        stage = StageModel(spec, topo.tp_group, torch.device("cpu"))
        init_from_seed(stage, seed=3)
        calls, saved = [0], [0]
        stage.layers["1"].register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

        def pack(t):
            saved[0] += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = stage(tokens).float().pow(2).mean()
        loss.backward()
        results[recompute] = (calls[0], saved[0], {n: p.grad.clone() for n, p in stage.named_parameters()})
    assert results[False][0] == 1 and results[True][0] == 2
    assert results[True][1] < results[False][1] / 2
    for name, grad in results[False][2].items():
        torch.testing.assert_close(results[True][2][name], grad, rtol=1e-5, atol=1e-7)


def test_init_is_plan_independent(world_of_one):
    """A TP rank's initial shard is its slice of the single-GPU tensor."""
    from sailor_ext.model import init_tensor

    full = init_tensor("layers.2.mlp.linear_fc1.weight", (256, 64), seed=3, num_blocks=4)
    again = init_tensor("layers.2.mlp.linear_fc1.weight", (256, 64), seed=3, num_blocks=4)
    other = init_tensor("layers.3.mlp.linear_fc1.weight", (256, 64), seed=3, num_blocks=4)
    assert torch.equal(full, again) and not torch.equal(full, other)
    assert full.std().item() == pytest.approx(0.02, rel=0.05)


def test_kernel_fusion_applies_where_the_model_has_the_layers(tmp_path):
    """Compiled SwiGLU and rotary kernels (CUDA only, tests/gpu runs them) go to the models that have those
    layers: megatron's SwiGLU fusion only for gated SiLU MLPs, rotary only without learned positions. Where
    a stage does not ask, the rotary call is megatron's own function, bitwise."""
    from megatron.core.models.common.embeddings import rope_utils

    from sailor_ext import compat
    from sailor_ext.model import KernelFusion, _rotary, transformer_config

    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, '
                      '"num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512, '
                      '"max_position_embeddings": 64}')
    llama, opt = get_model(str(config), seq_len=32), get_model("tiny")
    on = KernelFusion(swiglu=True, rope=True)
    assert on.applied(llama) == ["swiglu", "rope"] and on.applied(opt) == []
    assert KernelFusion.default(torch.device("cpu")) == KernelFusion()
    assert KernelFusion.default(torch.device("cuda")) == on
    assert transformer_config(llama, 1, on).bias_activation_fusion
    assert not transformer_config(llama, 1).bias_activation_fusion
    assert not transformer_config(opt, 1, on).bias_activation_fusion
    eager = transformer_config(llama, 1)
    t, freqs = torch.randn(32, 2, 8, 8), torch.randn(32, 1, 1, 8)
    cp = compat.NO_CONTEXT_PARALLEL  # what megatron's SelfAttention passes in our stages
    assert torch.equal(_rotary(t, freqs, eager, cp_group=cp),
                       rope_utils.apply_rotary_pos_emb(t, freqs, eager, cp_group=cp))


def test_capped_attention_block_keeps_what_the_estimator_counts(world_of_one, tmp_path):
    """A Gemma 2 block (sandwich norms, GeGLU, capped attention, which runs as our own code on CPU
    and CUDA alike): the tensors autograd saves, per sample, are what the planner's estimate counts
    for our runtime."""
    model = _small_model({"model_type": "gemma2", "head_dim": 16, "sliding_window": 8}, tmp_path)
    measured, counted = _block_saved_floats(model)
    assert measured == pytest.approx(counted, rel=0.01)


def _small_model(cfg: dict, tmp_path, seq_len: int = 32):
    import json

    cfg = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 1024, **cfg}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return get_model(str(tmp_path / "config.json"), seq_len=seq_len)


def _saved_per_token(model, dtype=torch.float32, mixer: bool = False) -> float:
    """Values (of `dtype`) per token that block 1 of `model` (mixer: its Gated DeltaNet alone) keeps for backward
    beyond its input: autograd's saved tensors, at two batch sizes (the rotary angles and masks do not grow with
    the batch)."""
    from sailor_ext.model import StageModel, StageSpec, init_from_seed

    stage = StageModel(StageSpec(model, 1, 1, 1, 0, model.padded_vocab(1)), dist.group.WORLD, torch.device("cpu"))
    init_from_seed(stage, seed=1)
    stage.to(dtype)
    run = stage.layers["1"].linear_attention if mixer else functools.partial(stage.run_layer, 1)
    weights = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    saved_bytes = {}
    for batch in (1, 3):
        x = torch.randn(model.seq_len, batch, model.hidden, dtype=dtype, requires_grad=True)
        storages = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weights and ptr != x.untyped_storage().data_ptr():
                storages[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run(x)
        saved_bytes[batch] = sum(storages.values())
    return (saved_bytes[3] - saved_bytes[1]) / 2 / model.seq_len / (torch.finfo(dtype).bits // 8)


def _block_saved_floats(model) -> tuple[float, float]:
    """(measured, counted) fp32 values per token that block 1 of `model` keeps for backward: autograd's
    saved tensors and the planner's estimate for our runtime."""
    from planner.profiles.estimate import activation_floats

    # the estimate counts the block's input with its first norm; the measurement leaves it out
    return _saved_per_token(model) + model.hidden, activation_floats(model, 1, 1, "sailor", "fp32")


def test_linear_attention_block_keeps_what_the_estimator_counts(world_of_one, tmp_path):
    """What a Gated DeltaNet block keeps per token grows with its value heads, key heads, head widths and
    convolution as ModelSpec.linear_attention_floats counts (fp32; 8 chunks; compared as differences between
    blocks alike but for that, as the MoE test below: the MLP's share on CPU is not the CUDA one counted)."""
    base = {"model_type": "qwen3_5_text", "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 12, "layer_types": ["linear_attention"] * 2}
    variants = [base, {**base, "linear_num_value_heads": 8}, {**base, "linear_key_head_dim": 16},
                {**base, "linear_value_head_dim": 24}, {**base, "linear_num_key_heads": 4, "linear_num_value_heads": 8}]
    (m0, c0), *others = [_block_saved_floats(_small_model(cfg, tmp_path, seq_len=512)) for cfg in variants]
    assert c0 == pytest.approx(m0, rel=0.07)  # (measured: the MLP and norms' CPU share, 182 of 3165)
    for measured, counted in others:
        assert counted - c0 == pytest.approx(measured - m0, rel=0.015)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_delta_net_keeps_what_the_planner_counts(world_of_one, tmp_path, dtype):
    """A Gated DeltaNet alone (8 chunks) keeps per token, beyond its input, what ModelSpec.linear_attention_floats
    counts, in fp32 and in bf16 (where the rule's values are fp32, twice the bytes): measured within 0.6 %."""
    base = {"model_type": "qwen3_5_text", "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 12, "layer_types": ["linear_attention"] * 2}
    for cfg in (base, {**base, "linear_num_value_heads": 8}, {**base, "linear_value_head_dim": 24}):
        model = _small_model(cfg, tmp_path, seq_len=512)
        measured = _saved_per_token(model, dtype, mixer=True)
        assert model.linear_attention_floats(1, torch.finfo(dtype).bits // 8) == pytest.approx(measured, rel=0.006)


def test_xielu_mlp_keeps_what_the_estimator_counts(world_of_one, tmp_path):
    """Apertus's xIELU keeps four products of its input and its x > 0 mask beyond what ReLU keeps, as the planner
    counts (fp32: 4.25 values per MLP unit; the difference between the two blocks, as above)."""
    relu, xielu = (_block_saved_floats(_small_model({"model_type": "apertus", "hidden_act": act, "pad_token_id": None},
                                                    tmp_path, seq_len=256)) for act in ("relu", "xielu"))
    assert xielu[1] - relu[1] == xielu[0] - relu[0] == 4.25 * 96  # (intermediate_size 96)


def test_moe_block_keeps_what_the_estimator_counts(world_of_one, tmp_path):
    """What a mixture-of-experts MLP keeps per token grows with the experts, the experts per token,
    renormalisation and a shared expert as ModelSpec.moe_activation_floats counts (compared as differences between
    blocks alike but for that: the attention's share on CPU is not the CUDA one the estimate counts)."""
    base = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
            "head_dim": 16}
    variants = [base, {**base, "num_experts": 8}, {**base, "num_experts": 8, "num_experts_per_tok": 4},
                {**base, "norm_topk_prob": True}]
    (m0, c0), *others = [_block_saved_floats(_small_model(cfg, tmp_path)) for cfg in variants]
    assert c0 == pytest.approx(m0, rel=0.02)
    for measured, counted in others:
        assert counted - c0 == pytest.approx(measured - m0, rel=1e-3)
    from dataclasses import replace

    qwen2 = _small_model({**base, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 64}, tmp_path)
    (m0, c0), (m1, c1) = _block_saved_floats(replace(qwen2, shared_expert_ffn=0)), _block_saved_floats(qwen2)
    assert c1 - c0 == pytest.approx(m1 - m0, rel=1e-3)


def test_olmo2_block_keeps_what_the_estimator_counts(world_of_one, tmp_path):
    """OLMo 2's block against the same block with per-head q/k norms and with pre-norms too: what the
    full-width q/k norms and the missing pre-norms change in the tensors kept is what the planner counts."""
    from dataclasses import replace

    olmo2 = _small_model({"model_type": "olmo2"}, tmp_path)
    m0, c0 = _block_saved_floats(olmo2)
    for variant in (replace(olmo2, qk_norm_full=False), replace(olmo2, input_norms=True)):
        measured, counted = _block_saved_floats(variant)
        # (measured: per-head norms keep 4 values more per token, not counted; pre-norms 4h + 2 more, 4h counted)
        assert abs((measured - m0) - (counted - c0)) <= 0.02 * m0, (measured - m0, counted - c0)


def test_gpt_oss_experts_keep_what_the_estimator_counts(world_of_one, tmp_path):
    """gpt-oss's clamped GLU and its experts' biases each add to what a block keeps what the planner adds for
    them (compared as differences, as for the other mixtures of experts; its attention with sinks runs
    PyTorch's math kernel on CPU, not the CUDA one the estimate counts)."""
    from dataclasses import replace

    gpt_oss = _small_model({"model_type": "gpt_oss", "head_dim": 16, "sliding_window": 8, "num_local_experts": 4,
                            "num_experts_per_tok": 2}, tmp_path)
    m0, c0 = _block_saved_floats(gpt_oss)
    for variant in (replace(gpt_oss, glu_limit=0.0), replace(gpt_oss, mlp_bias=False)):
        measured, counted = _block_saved_floats(variant)
        assert counted - c0 == pytest.approx(measured - m0, rel=1e-3), (measured - m0, counted - c0)


def test_alibi_slopes_are_transformers_for_any_head_count():
    """ALiBi's slopes equal (torch.equal) transformers' BLOOM slopes for 1 to 130 heads: powers of two and the
    counts between them, whose last heads take the odd steps of the next power's series."""
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    from sailor_ext.attention import alibi_slopes

    for heads in range(1, 131):
        assert torch.equal(alibi_slopes(heads), _get_alibi_slopes(heads, torch.device("cpu"))), heads


@pytest.mark.parametrize("head_dim, window", [(24, None), (16, 5), (64, None)])
def test_sink_attention_is_transformers_gpt_oss_attention(head_dim, window):
    """Attention with sinks, run as one more key of PyTorch's fused attention, gives transformers' gpt-oss
    attention (its eager function, the sinks concatenated to the scores), output and gradients of q, k, v and
    the sinks, with grouped queries, with and without a window, for head widths that need padding and not."""
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from sailor_ext.attention import sink_attention, window_mask

    torch.manual_seed(0)
    b, heads, kv_heads, s = 2, 4, 2, 12
    q, k, v = (torch.randn(b, n, s, head_dim, dtype=torch.float64, requires_grad=True)
               for n in (heads, kv_heads, kv_heads))
    sinks = torch.randn(heads, dtype=torch.float64, requires_grad=True)
    scale = head_dim ** -0.5
    hidden = window_mask(s, window or s, torch.device("cpu"))
    ours = sink_attention(q, k, v, None if window is None else hidden, scale, sinks)  # [b, heads, s, d]
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=heads // kv_heads, training=False)
    additive = torch.zeros(1, 1, s, s, dtype=torch.float64).masked_fill(hidden, torch.finfo(torch.float64).min)
    theirs, _ = eager_attention_forward(module, q, k, v, additive, scaling=scale)  # [b, s, heads, d]
    theirs = theirs.transpose(1, 2)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(ours)
    grads = [torch.autograd.grad(out, (q, k, v, sinks), grad) for out in (ours, theirs)]
    for mine, reference in zip(*grads):
        torch.testing.assert_close(mine, reference, rtol=1e-10, atol=1e-12)


def test_latent_attention_keeps_what_the_estimator_counts(world_of_one, tmp_path):
    """DeepSeek-V3's block (latent attention, its first block's dense MLP): what a q latent, a wider kv latent and
    a wider rotary share add to the tensors kept is what the planner adds for them (differences, as above: the
    attention kernel's share on CPU is not the CUDA one counted)."""
    from dataclasses import replace

    model = _small_model({"model_type": "deepseek_v3", "num_key_value_heads": 4, "moe_intermediate_size": 32,
                          "n_routed_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2,
                          "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                          "qk_rope_head_dim": 8, "v_head_dim": 12}, tmp_path)
    assert model.dense(0)
    m0, c0 = _block_saved_floats(model)
    for variant in (replace(model, q_lora_rank=0), replace(model, kv_lora_rank=40),
                    replace(model, rope_head_dim=16, head_dim_override=32)):
        measured, counted = _block_saved_floats(variant)
        # (each latent's norm keeps one value per token more, its rsqrt, not counted)
        assert counted - c0 == pytest.approx(measured - m0, abs=1), (measured - m0, counted - c0)


def _deepseek_v3_routers(tmp_path):
    """A small DeepSeek-V3 (16 experts in 4 groups, 4 per token), transformers' DeepseekV3TopkRouter with random
    weights and score biases, and our MoE block with the same router: (model, theirs, ours)."""
    import torch.nn.functional as F

    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from sailor_ext.moe import MoE

    fields = {"n_routed_experts": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4,
              "routed_scaling_factor": 2.5}
    model = _small_model({"model_type": "deepseek_v3", "num_key_value_heads": 4, "first_k_dense_replace": 0,
                          **fields}, tmp_path)
    theirs = DeepseekV3TopkRouter(transformers.DeepseekV3Config(hidden_size=model.hidden, **fields))
    torch.manual_seed(0)
    with torch.no_grad():
        theirs.weight.normal_(0, 0.3)
        theirs.e_score_correction_bias.normal_(0, 0.1)
    ours = MoE(model, 1, dist.group.WORLD, F.silu)
    with torch.no_grad():
        ours.router.weight.copy_(theirs.weight)
        ours.router.score_bias.copy_(theirs.e_score_correction_bias)
    return model, theirs, ours


def test_sigmoid_routing_is_transformers_deepseek_v3_and_its_balancing_megatrons(world_of_one, tmp_path):
    """DeepSeek-V3's routing (sigmoid scores, the score biases, the best groups, renormalised and scaled weights)
    chooses and weighs as transformers' DeepseekV3TopkRouter, and what its load balancing reads (normalised scores,
    each token's top k of them) is Megatron-LM's compute_routing_scores_for_aux_loss."""
    import torch.nn.functional as F
    from megatron.core.transformer.moe.moe_utils import compute_routing_scores_for_aux_loss

    model, theirs, ours = _deepseek_v3_routers(tmp_path)
    x = torch.randn(256, model.hidden)
    logits, their_weights, their_chosen = theirs(x)
    weights, chosen, scores = ours._sigmoid_route(F.linear(x, ours.router.weight).float())
    probs, counted = ours.balance_reads(scores, chosen)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * model.routed_scale  # (as forward goes on)
    order, their_order = chosen.argsort(dim=-1), their_chosen.argsort(dim=-1)
    assert torch.equal(chosen.gather(1, order), their_chosen.gather(1, their_order))
    torch.testing.assert_close(weights.gather(1, order), their_weights.gather(1, their_order), rtol=1e-6, atol=0)
    # the bias and the groups matter here: plain top k of the scores chooses otherwise for some tokens
    assert not torch.equal(chosen.sort(dim=-1).values, torch.sigmoid(logits).topk(4).indices.sort(dim=-1).values)
    routing_map, scores = compute_routing_scores_for_aux_loss(logits, 4, "sigmoid")
    assert torch.equal(probs, scores)
    assert torch.equal(torch.zeros_like(routing_map).scatter(1, counted, True), routing_map)


def test_bf16_model_routes_in_fp32_as_transformers_deepseek_v3(world_of_one, tmp_path):
    """Under bf16, DeepSeek-V3's router stays fp32 (router_fp32: its weight and score biases, and logits of the
    bf16 input taken to fp32), as transformers keeps it in a bf16 model: the same experts for every token as
    transformers' DeepseekV3TopkRouter. Routing with the weight rounded to bf16 chooses otherwise for some tokens."""
    import torch.nn.functional as F

    from sailor_ext.precision import MainParams

    model, theirs, ours = _deepseek_v3_routers(tmp_path)
    assert model.router_fp32
    main = MainParams(ours, torch.bfloat16)
    assert ours.linear_fc1.weight.dtype == torch.bfloat16
    assert ours.router.weight.dtype == ours.router.score_bias.dtype == torch.float32
    assert torch.equal(ours.router.weight, main.params["router.weight"])  # (the master, unrounded)
    x = torch.randn(4096, model.hidden).bfloat16()
    _, _, their_chosen = theirs(x)  # (transformers takes x to fp32 against its fp32 weight)
    _, chosen, _ = ours._sigmoid_route(ours.router_logits(x))
    assert torch.equal(chosen.sort(dim=-1).values, their_chosen.sort(dim=-1).values)
    rounded = F.linear(x, ours.router.weight.bfloat16()).float()
    _, chosen_bf16, _ = ours._sigmoid_route(rounded)
    assert not torch.equal(chosen_bf16.sort(dim=-1).values, their_chosen.sort(dim=-1).values)


def test_grouped_softmax_routing_is_transformers_deepseek_v2(world_of_one, tmp_path):
    """DeepSeek-V2's group-limited routing (softmax probabilities, the best groups by their best probability,
    weights unrenormalised and scaled) chooses and weighs as transformers' DeepseekV2TopkRouter."""
    import torch.nn.functional as F

    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    from sailor_ext.moe import MoE

    fields = {"n_routed_experts": 16, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4,
              "routed_scaling_factor": 2.5, "topk_method": "group_limited_greedy"}
    model = _small_model({"model_type": "deepseek_v2", "num_key_value_heads": 4, **fields}, tmp_path)
    theirs = DeepseekV2TopkRouter(transformers.DeepseekV2Config(hidden_size=model.hidden, **fields))
    torch.manual_seed(0)
    with torch.no_grad():
        theirs.weight.normal_(0, 0.3)
    ours = MoE(model, 1, dist.group.WORLD, F.silu)
    with torch.no_grad():
        ours.router.weight.copy_(theirs.weight)
    x = torch.randn(256, model.hidden)
    _, their_weights, their_chosen = theirs(x)
    weights, chosen, probs = ours._softmax_route(F.linear(x, ours.router.weight).float())
    weights = weights * model.routed_scale  # (as forward goes on; DeepSeek-V2 does not renormalise)
    order, their_order = chosen.argsort(dim=-1), their_chosen.argsort(dim=-1)
    assert torch.equal(chosen.gather(1, order), their_chosen.gather(1, their_order))
    torch.testing.assert_close(weights.gather(1, order), their_weights.gather(1, their_order), rtol=1e-6, atol=0)
    assert not torch.equal(chosen.sort(dim=-1).values, probs.topk(4).indices.sort(dim=-1).values)  # groups matter


def test_score_bias_update_is_megatrons(world_of_one, monkeypatch):
    """DeepSeek-V3's auxiliary-loss-free balancing step (updated_score_bias) is Megatron-LM's
    get_updated_expert_bias, ties with the mean included (its all-reduce over a group of one here)."""
    from megatron.core.transformer.moe import moe_utils

    from sailor_ext.moe import updated_score_bias

    monkeypatch.setattr(moe_utils.parallel_state, "get_tensor_and_data_parallel_group",
                        lambda **kwargs: dist.group.WORLD)
    generator = torch.Generator().manual_seed(0)
    for experts in (4, 8, 256):
        loads = torch.randint(0, 50, (experts,), generator=generator).double()
        loads[0] = loads.mean().round()  # (a tie with the mean, where it is whole)
        bias = torch.randn(experts, generator=generator)
        expected = moe_utils.get_updated_expert_bias(loads.clone(), bias, 1e-3)
        assert torch.equal(updated_score_bias(bias, loads, 1e-3), expected.float())  # (Megatron's buffer: fp32)


@pytest.mark.parametrize("seq", [5, 64, 150])
def test_gated_delta_rule_is_the_recurrence_token_by_token(seq):
    """Our chunked gated delta rule (chunks of 64: one partial chunk, one whole, three with the state carried
    between them) gives transformers' token-by-token recurrence's outputs and gradients, value heads sharing key
    heads in pairs."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    from sailor_ext.linear_attention import gated_delta_rule, l2_normalise

    torch.manual_seed(0)
    b, key_heads, value_heads, dk, dv = 2, 2, 4, 8, 12
    inputs = [torch.randn(b, seq, key_heads, dk), torch.randn(b, seq, key_heads, dk),
              torch.randn(b, seq, value_heads, dv), -torch.rand(b, seq, value_heads) * 2,
              torch.rand(b, seq, value_heads)]
    weight = torch.randn(b, seq, value_heads, dv)  # a loss that weighs every output differently
    grads = []
    for ours in (True, False):
        q, k, v, g, beta = (t.clone().requires_grad_() for t in inputs)
        if ours:
            qq, kk = (l2_normalise(t).repeat_interleave(value_heads // key_heads, 2).transpose(1, 2) for t in (q, k))
            out = gated_delta_rule(qq * dk ** -0.5, kk, *(t.transpose(1, 2) for t in (v, g, beta))).transpose(1, 2)
        else:
            out, _ = torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        (out * weight).sum().backward()
        grads.append((out.detach(), [t.grad for t in (q, k, v, g, beta)]))
    (ours, our_grads), (theirs, their_grads) = grads
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for mine, expected in zip(our_grads, their_grads):
        torch.testing.assert_close(mine, expected, rtol=1e-4, atol=1e-4)
