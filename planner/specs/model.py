"""Decoder-only transformer models, described layer by layer.

A model is a list of layers the way a pipeline sees it: the embedding, the
transformer blocks, (for LLaMA) a separate final norm, and the LM head with
the loss. Sailor's published profiles number layers the same way (OPT-350 is
26 layers: embedding, 24 blocks, head), so a plan's layer ranges mean the same
thing in both worlds.

`ModelSpec` holds the whole architecture: the shape arithmetic below (for the
planner) and the module choices of the runtime (sailor_ext/model.py) read the
same fields. Which fields a Hugging Face `model_type` sets, and how its
weights are named, lives with its family in planner/specs/families/.

For every layer we know, as pure functions of the tensor-parallel degree `tp`:
  * parameters held by one GPU of the TP group,
  * activation floats kept for backward, per token of one sample,
  * output floats per token (what a pipeline stage sends to the next),
  * forward FLOPs per token (backward is counted as 2x forward).

Megatron layout: QKV/fc1 are column-parallel, proj/fc2 row-parallel (their
biases and the norms are replicated), the vocabulary is padded to a multiple of
128*tp and split across the TP group, learned position embeddings are
replicated. Counted this way, parameters match Sailor's llm_info.json exactly
for OPT-350, OPT-30 and GPT-Neo-2.7 at every TP degree; counted without the
padding (`padded=False`) they match transformers' models of the same config.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from planner.errors import SailorError
from planner.inputs import FLOAT_MAX, short

EMBEDDING, BLOCK, FINAL_NORM, HEAD = "embedding", "block", "final_norm", "head"
# relu2: ReLU squared; xielu: xIELU, with scalars of its own in each block (Apertus; sailor_ext.model.XIELU)
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "relu2", "silu", "xielu")
DELTA_CHUNK = 64  # tokens per chunk of the gated delta rule (linear attention: sailor_ext/linear_attention.py)
DEFAULT_SEQ_LEN = 2048  # sequence length of a config.json model when none is given (capped by its context)
MAX_BLOCKS = 4096  # far beyond any real model; keeps a malformed config from building a huge description
LIMITS = {"hidden": 1 << 20, "heads": 1 << 16, "ffn_hidden": 1 << 22, "vocab": 1 << 24, "seq_len": 1 << 24,
          "vocab_divisor": 1 << 24}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only transformer (validated on construction).

    The defaults describe a Megatron-style GPT (pre-LN, GELU, biases, learned
    positions, untied head): Sailor's presets are that. Models read from a
    Hugging Face config set the fields their family needs.
    """

    name: str
    family: str  # opt | gpt2 | gpt-neo | gpt-neox | llama | mixtral | qwen3_moe | olmoe | olmo2 | phi3 | gemma
    # | gemma2 | starcoder2 | cohere (families/)
    hidden: int
    num_blocks: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int  # training sequence length (tokens per sample)
    kv_heads: int = 0  # 0 means multi-head attention (kv_heads == heads)
    tied_embeddings: bool = False
    gated_mlp: bool = False  # SwiGLU MLP (LLaMA): fc1 holds [gate; up]
    rms_norm: bool = False  # RMSNorm has no bias
    learned_positions: bool = True  # False: rotary position embeddings on q and k
    qkv_bias: bool = True
    out_bias: bool = True  # the attention's output projection
    mlp_bias: bool = True
    separate_final_norm: bool = False  # LLaMA: the final norm is its own layer
    vocab_divisor: int = 128  # Megatron's --make-vocab-size-divisible-by
    # -- exact architecture of models read from Hugging Face configs ----------
    max_positions: int = 0  # context length (0: seq_len)
    position_offset: int = 0  # OPT's learned positions start at row 2
    embed_dim: int = 0  # width of the word embedding when projected to/from `hidden` (OPT-350m: 512); 0: hidden
    head_dim_override: int = 0  # 0: hidden // heads
    post_norm: bool = False  # norm after each residual add (OPT-350m) instead of before each sublayer
    final_norm: bool = True  # a norm before the head (OPT-350m has none)
    activation: str = "gelu"  # gelu | gelu_tanh | relu | relu2 (squared) | silu
    norm_eps: float = 1e-5
    attention_scale: float = 0.0  # 0: 1/sqrt(head_dim); GPT-Neo uses 1
    # q after rotary positions times 1 + beta * ln(1 + floor((p + offset) / span)) at position p (0-based), which
    # lengthens the attention's reach beyond the original context `span`: Ministral 3's llama_4_scaling_beta on
    # every block; Llama 4's temperature tuning (offset 1) on the blocks without rotary positions alone
    # (query_scale_nope); beta 0: none
    query_scale_beta: float = 0.0
    query_scale_span: int = 0
    query_scale_offset: int = 0
    query_scale_nope: bool = False
    attention_chunk: int = 0  # the blocks with rotary positions attend within chunks this long (Llama 4); 0: none
    qk_l2_norm: bool = False  # each head's q and k divided by their RMS (no weight) on rotary blocks (Llama 4)
    rotary_reversed: bool = False  # rotary positions turn each pair by -angle (nanochat's sign-flipped rotate_half)
    # no rotary positions: each head's attention scores get its slope times the key's position (ALiBi: BLOOM)
    alibi: bool = False
    windows: tuple[int, ...] = ()  # per block: 0 = full causal attention, w = the last w tokens only
    nope_blocks: tuple[int, ...] = ()  # blocks (0-based) whose attention has no rotary positions (SmolLM3's NoPE)
    rope_theta: float = 10000.0
    # e.g. (("type", "llama3"), ("factor", 8.0), ...); LongRoPE's factors are tuples, one per rotated pair
    rope_scaling: tuple[tuple[str, float | str | tuple[float, ...]], ...] = ()
    pad_token: int = -1  # the token whose embedding row gets no gradient (Hugging Face's padding_idx); -1: none
    qk_norm: bool = False  # an RMSNorm over each head's q and k, before rotary positions (Qwen3)
    qk_norm_after_rotary: bool = False  # the per-head q/k RMSNorms come after the rotary positions (HunYuan)
    qk_norm_full: bool = False  # the q (k) norm spans all heads together, its weight split over TP (OLMo 2, OLMoE)
    # each head has a q (k) norm weight of its own, [heads, head_dim], split over TP with the heads; the norm is
    # the model's kind, without bias (Command R+, StableLM 2 12B: LayerNorms)
    qk_norm_per_head: bool = False
    rotary_fraction: float = 1.0  # share of each head's dimensions that rotary positions rotate (partial rotary)
    parallel_residual: bool = False  # x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX) instead of one after the other
    norm_offset: bool = False  # norms scale by (1 + w), w kept and initialised at 0 (Gemma; Nemotron's LayerNorms)
    embedding_multiplier: float = 1.0  # word embeddings times it, rounded to the compute dtype (Gemma: sqrt(hidden))
    embedding_norm: bool = False  # the model's norm on the embeddings before the first block (nanochat)
    sandwich_norm: bool = False  # each sublayer's output is normalised too, before its residual add (Gemma 2, 3)
    input_norms: bool = True  # a norm before each sublayer; False: only the sandwich norms after them (OLMo 2)
    attn_softcap: float = 0.0  # attention scores c * tanh(scores / c) before the mask (Gemma 2); 0: none
    logit_softcap: float = 0.0  # the same on the logits (Gemma 2); 0: none
    local_rope_theta: float = 0.0  # rotary base of the windowed blocks, unscaled (Gemma 3); 0: as every block
    residual_multiplier: float = 1.0  # x + m * f(x): each sublayer's output scaled before its residual add (Granite)
    logits_divisor: float = 1.0  # the logits divided by it (Granite's logits_scaling; Cohere: 1 / logit_scale)
    head_bias: bool = False  # the output layer has a bias, one per vocabulary row (Phi)
    norm_bias: bool = True  # LayerNorms have a bias (Cohere's have none)
    norm_weight: bool = True  # norms scale by a learned weight; False: no weight and no bias (OLMo 1)
    shared_norm: bool = False  # a parallel residual whose one norm feeds attention and MLP (Cohere)
    rotary_interleaved: bool = False  # rotary positions rotate adjacent pairs (2i, 2i + 1) (Cohere), not halves
    # mixture of experts (Mixtral, Qwen3-MoE): each block's MLP is `experts` MLPs of ffn_hidden each, and a
    # router (a linear hidden -> experts) sends each token to the `experts_per_token` with the highest softmax
    # probabilities, whose outputs it sums weighted by those (renormalised to sum to 1 with expert_renorm)
    experts: int = 0  # 0: a dense MLP
    experts_per_token: int = 0
    expert_renorm: bool = True
    # a shared expert beside the routed ones (Qwen2-MoE): an MLP this wide that every token passes through, its
    # output scaled by sigmoid(x . w_gate) and added to the routed experts'; 0: none
    shared_expert_ffn: int = 0
    shared_expert_gated: bool = True  # False: the shared expert's output is added as it is (GraniteMoeShared)
    router_bias: bool = False  # the router's linear has a bias (gpt-oss)
    expert_input_weighted: bool = False  # a chosen expert's input is scaled by its weight, not its output (Llama 4)
    # gpt-oss's experts: a clamped GLU, gate' = min(gate, limit), up' = clip(up, -limit, limit), out =
    # gate' * sigmoid(glu_alpha * gate') * (up' + 1); 0: activation(gate) * up
    glu_limit: float = 0.0
    glu_alpha: float = 1.0
    attention_sinks: bool = False  # a learned logit per head joins each softmax as a key with no value (gpt-oss)
    # DeepSeek's routers: experts scored by sigmoid(logit) instead of the softmax (V3); a fixed bias per expert
    # added to the scores that choose (not to those that weigh; V3); experts in `expert_groups` groups, a token's
    # chosen from the `expert_groups_per_token` groups whose two best biased scores sum highest (sigmoid, V3) or
    # whose best probability is highest (softmax, V2); the chosen weights (renormalised with expert_renorm) times
    # routed_scale
    router_sigmoid: bool = False
    expert_score_bias: bool = False
    # the router's weight (bias, score biases) kept and its logits computed in fp32 under bf16/fp16, as transformers
    # keeps DeepSeek's, GLM-4.5's, dots.llm1's, ERNIE-4.5-MoE's, K-EXAONE's and HunYuan's (routing decisions
    # rounded to bf16 differ at near-ties)
    router_fp32: bool = False
    expert_groups: int = 1
    expert_groups_per_token: int = 1
    routed_scale: float = 1.0
    # blocks (0-based) of a mixture of experts whose MLP is dense, dense_ffn wide (DeepSeek's first blocks)
    dense_blocks: tuple[int, ...] = ()
    dense_ffn: int = 0
    # multi-head latent attention (DeepSeek-V2/V3): each token's k and v come from one latent kv_lora_rank wide
    # (up-projected per head to k's head_dim - rope_head_dim unrotated dimensions and v_head_dim), and its q from
    # one q_lora_rank wide (0: from the hidden state directly); each head's q and k end in rope_head_dim rotated
    # dimensions, k's shared by all heads (projected from the hidden state); 0: ordinary attention
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0
    # Gated DeltaNet (Qwen3.5, Qwen3-Next): blocks (0-based) whose attention is a linear recurrence instead
    # (sailor_ext/linear_attention.py): per token a short causal convolution (linear_conv taps) over its q, k and
    # v, then for each of linear_value_heads heads a state [linear_key_dim, linear_value_dim] decayed and
    # corrected by the delta rule, read by q; q and k have linear_key_heads heads, each serving
    # linear_value_heads / linear_key_heads value heads
    linear_blocks: tuple[int, ...] = ()
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv: int = 0
    attention_gate: bool = False  # the attention's output times sigmoid(a gate projected beside q) (Qwen3.5)
    qkv_clip: float = 0.0  # q, k and v each clamped to [-c, c] after their projection (OLMo 1.7's clip_qkv); 0: none
    hf_model_type: str = ""  # the Hugging Face model_type it maps to ("" for presets)

    def __post_init__(self):
        for field in ("hidden", "num_blocks", "heads", "ffn_hidden", "vocab", "seq_len", "vocab_divisor"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SailorError(f"model {self.name!r}: {field} must be a positive integer, not {short(value)}")
            if value > LIMITS.get(field, value):
                raise SailorError(f"model {self.name!r}: {field} {short(value)} is beyond {LIMITS[field]}, larger "
                                  "than any model sailor can plan; check the value")
        for field in ("kv_heads", "max_positions", "embed_dim", "head_dim_override", "position_offset",
                      "query_scale_span", "query_scale_offset", "attention_chunk"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1 << 30:
                raise SailorError(f"model {self.name!r}: {field} must be an integer from 0 to {1 << 30}, not "
                                  f"{short(value)}")
        if isinstance(self.rotary_fraction, bool) or not isinstance(self.rotary_fraction, (int, float)) or \
                not 0 < self.rotary_fraction <= 1 or (not self.learned_positions and self.rotary_dim < 2):
            raise SailorError(f"model {self.name!r}: rotary_fraction must be above 0 and at most 1, rotating at "
                              f"least 2 of the {self.head_dim} dimensions of a head, not {short(self.rotary_fraction)}")
        if not self.learned_positions and self.rotary_dim % 2:
            raise SailorError(f"model {self.name!r}: rotary positions turn pairs of dimensions, and {self.rotary_dim} "
                              f"of each head's {self.head_dim} would turn; make head_dim (or its rotated share) even")
        for field in ("norm_eps", "attention_scale", "rope_theta", "attn_softcap", "logit_softcap",
                      "local_rope_theta", "glu_limit", "query_scale_beta", "qkv_clip"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1e30:
                raise SailorError(f"model {self.name!r}: {field} must be a finite number >= 0, not {short(value)}")
        if self.query_scale_beta and not self.query_scale_span:
            raise SailorError(f"model {self.name!r}: a query scale (query_scale_beta) needs the original context "
                              "it grows past (query_scale_span)")
        if self.num_blocks > MAX_BLOCKS:
            raise SailorError(f"model {self.name!r}: {short(self.num_blocks)} transformer blocks is beyond "
                              f"{MAX_BLOCKS}; check num_hidden_layers")
        if not self.head_dim_override and self.hidden % self.heads:
            raise SailorError(
                f"model {self.name!r}: hidden size {self.hidden} is not divisible by {self.heads} heads"
            )
        if self.kv_heads < 0 or (self.kv_heads and self.heads % self.kv_heads):
            raise SailorError(f"model {self.name!r}: {self.heads} heads not divisible by kv_heads {self.kv_heads}")
        if self.activation not in ACTIVATIONS:
            raise SailorError(f"model {self.name!r}: activation {self.activation!r} is not supported; use one of "
                              f"{', '.join(ACTIVATIONS)}")
        if self.activation == "xielu" and (self.gated_mlp or self.experts or self.linear_blocks):
            raise SailorError(f"model {self.name!r}: the xIELU activation goes in an ungated dense MLP, not a gated "
                              "one or experts")
        if self.qk_norm and not self.rms_norm and not self.qk_norm_per_head:
            raise SailorError(f"model {self.name!r}: per-head q/k norms are RMSNorms; a model with them has "
                              "RMSNorms (rms_norm)")
        for field in ("embedding_multiplier", "residual_multiplier", "logits_divisor", "glu_alpha", "routed_scale"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1e30:
                raise SailorError(f"model {self.name!r}: {field} must be a positive finite number, not {short(value)}")
        for field, hi in (("experts", 1 << 16), ("experts_per_token", 1 << 16), ("shared_expert_ffn", 1 << 22),
                          ("dense_ffn", 1 << 22), ("kv_lora_rank", 1 << 20), ("q_lora_rank", 1 << 20),
                          ("rope_head_dim", 1 << 16), ("v_head_dim", 1 << 16)):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= hi:
                raise SailorError(f"model {self.name!r}: {field} must be an integer from 0 to {hi}, not {short(value)}")
        if self.experts and not 1 <= self.experts_per_token <= self.experts:
            raise SailorError(f"model {self.name!r}: each token goes to 1 to {self.experts} of the {self.experts} "
                              f"experts, not {self.experts_per_token} (num_experts_per_tok)")
        if self.head_bias and self.tied_embeddings:
            raise SailorError(f"model {self.name!r}: a bias on the output layer (head_bias) with the head tied to the "
                              "embedding is not supported")
        if self.shared_expert_ffn and self.mlp_bias:
            raise SailorError(f"model {self.name!r}: a shared expert's linears have no biases (mlp_bias)")
        if (self.experts_per_token or self.shared_expert_ffn or self.router_bias or self.glu_limit) and \
                not self.experts:
            raise SailorError(f"model {self.name!r}: experts_per_token, a shared expert, a router bias or a clamped "
                              "GLU (glu_limit) without experts")
        self._check_router()
        self._check_latent_attention()
        self._check_linear_attention()
        if self.glu_limit and not self.gated_mlp:
            raise SailorError(f"model {self.name!r}: a clamped GLU (glu_limit) is a gated MLP (gated_mlp)")
        if (self.qk_norm_full or self.qk_norm_per_head) and not self.qk_norm or \
                (self.qk_norm_full and self.qk_norm_per_head):
            raise SailorError(f"model {self.name!r}: q/k norms across all heads (qk_norm_full) or with a weight per "
                              "head (qk_norm_per_head) are q/k norms (qk_norm), and not both")
        if self.qk_norm_after_rotary and (not self.qk_norm or self.qk_norm_full or self.qk_norm_per_head or
                                          self.norm_offset or self.latent or self.linear_blocks):
            raise SailorError(f"model {self.name!r}: q/k norms after the rotary positions (qk_norm_after_rotary) are "
                              "per-head RMSNorms (qk_norm) with a plain weight, in softmax attention")
        if not self.input_norms and not self.sandwich_norm:
            raise SailorError(f"model {self.name!r}: a block without norms before its sublayers (input_norms) "
                              "normalises their outputs (sandwich_norm)")
        if not self.norm_weight and (not self.rms_norm and self.norm_bias or self.norm_offset or self.qk_norm):
            raise SailorError(f"model {self.name!r}: norms without weights (norm_weight) have no bias (norm_bias), "
                              "offset (norm_offset) or q/k norms with weights (qk_norm)")
        if self.alibi and (self.learned_positions or self.attn_softcap or self.attention_sinks or self.latent or
                           self.linear_blocks):
            raise SailorError(f"model {self.name!r}: ALiBi (alibi) is softmax attention's only position signal, "
                              "without learned positions, soft caps, sinks, latent attention or Gated DeltaNet blocks")
        if self.qkv_clip and (self.latent or self.linear_blocks):
            raise SailorError(f"model {self.name!r}: clamping q, k and v (qkv_clip) needs their one projection, not "
                              "latent attention or Gated DeltaNet blocks")
        if self.norm_offset and not self.rms_norm and self.qk_norm:
            raise SailorError(f"model {self.name!r}: (1 + w) q/k norms are RMSNorms; a model with them has RMSNorms "
                              "(rms_norm)")
        if self.shared_norm and not self.parallel_residual:
            raise SailorError(f"model {self.name!r}: one norm for attention and MLP (shared_norm) needs them side by "
                              "side (parallel_residual)")
        if self.sandwich_norm and (self.post_norm or self.parallel_residual):
            raise SailorError(f"model {self.name!r}: a block normalises its sublayers' outputs (sandwich_norm) only "
                              "with pre-norm sublayers one after the other (not post_norm or parallel_residual)")
        scaling = dict(self.rope_scaling)
        if scaling.get("type") == "longrope" and not all(
                isinstance(scaling.get(k), tuple) and len(scaling[k]) == self.rotary_dim // 2
                for k in ("short_factor", "long_factor")):
            raise SailorError(f"model {self.name!r}: rope short_factor and long_factor must have one factor per "
                              f"rotated pair of head dimensions, {self.rotary_dim // 2}")
        if self.windows and len(self.windows) != self.num_blocks:
            raise SailorError(f"model {self.name!r}: {len(self.windows)} attention windows for {self.num_blocks} "
                              "blocks")
        if any(isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= 1 << 30 for w in self.windows):
            raise SailorError(f"model {self.name!r}: attention windows must be token counts >= 0")
        if any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.num_blocks for b in
               self.nope_blocks) or list(self.nope_blocks) != sorted(set(self.nope_blocks)) or \
                (self.nope_blocks and self.learned_positions):
            raise SailorError(f"model {self.name!r}: blocks without rotary positions must be block indices from 0 to "
                              f"{self.num_blocks - 1}, ascending, of a model with rotary positions")
        if not -1 <= self.pad_token < self.vocab:
            raise SailorError(f"model {self.name!r}: pad token {short(self.pad_token)} is outside the vocabulary "
                              f"of {self.vocab}")
        if self.max_positions and self.seq_len > self.max_positions:
            raise SailorError(f"--seq-length {self.seq_len} exceeds the context length {self.max_positions} of "
                              f"{self.name}; use --seq-length {self.max_positions} or less")

    def _check_router(self):
        for field in ("expert_groups", "expert_groups_per_token"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 16:
                raise SailorError(f"model {self.name!r}: {field} must be an integer from 1 to {1 << 16}, not "
                                  f"{short(value)}")
        if not self.experts:
            if self.router_sigmoid or self.expert_score_bias or self.expert_groups > 1 or self.routed_scale != 1 \
                    or self.dense_blocks or self.dense_ffn or self.expert_input_weighted:
                raise SailorError(f"model {self.name!r}: a sigmoid router, expert score biases, expert groups, a "
                                  "routed scale, weighted expert inputs or dense blocks among the experts' need "
                                  "experts")
            return
        groups, per_token = self.expert_groups, self.expert_groups_per_token
        if self.experts % groups or per_token > groups or (groups > 1 and self.router_sigmoid and
                                                           self.experts // groups < 2) or \
                self.experts_per_token > per_token * (self.experts // groups):
            raise SailorError(f"model {self.name!r}: {self.experts} experts in {groups} groups (n_group), each token's "
                              f"{self.experts_per_token} from {per_token} of them (topk_group): the groups must "
                              "split the experts evenly, at least 2 to a group, and hold the experts a token takes")
        if self.expert_score_bias and not self.router_sigmoid and self.expert_groups > 1:
            raise SailorError(f"model {self.name!r}: expert score biases go with a sigmoid router (router_sigmoid) "
                              "or a softmax router without expert groups")
        if any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.num_blocks for b in
               self.dense_blocks) or list(self.dense_blocks) != sorted(set(self.dense_blocks)) or \
                bool(self.dense_blocks) != bool(self.dense_ffn):
            raise SailorError(f"model {self.name!r}: dense blocks must be block indices from 0 to "
                              f"{self.num_blocks - 1}, ascending, with their MLP's width (dense_ffn)")

    def _check_latent_attention(self):
        if not self.kv_lora_rank:
            if self.q_lora_rank or self.rope_head_dim or self.v_head_dim:
                raise SailorError(f"model {self.name!r}: q_lora_rank, rope_head_dim and v_head_dim describe latent "
                                  "attention, which needs kv_lora_rank")
            return
        if self.learned_positions or not self.rope_head_dim or self.rope_head_dim % 2 or \
                self.rope_head_dim >= self.head_dim or self.rotary_fraction != 1:
            raise SailorError(f"model {self.name!r}: latent attention rotates an even rope_head_dim of each head's "
                              f"{self.head_dim} q and k dimensions, fewer than all, not {short(self.rope_head_dim)}")
        if self.kv_heads or self.qk_norm or self.attention_sinks or self.attn_softcap or self.qkv_bias or \
                self.out_bias or self.windows:
            raise SailorError(f"model {self.name!r}: latent attention has one k and v per head, and no q/k norms, "
                              "sinks, soft cap, attention biases or windows")

    def _check_linear_attention(self):
        sizes = ("linear_key_heads", "linear_value_heads", "linear_key_dim", "linear_value_dim", "linear_conv")
        for field in sizes:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1 << 16:
                raise SailorError(f"model {self.name!r}: {field} must be an integer from 0 to {1 << 16}, not "
                                  f"{short(value)}")
        if any(isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.num_blocks for b in
               self.linear_blocks) or list(self.linear_blocks) != sorted(set(self.linear_blocks)):
            raise SailorError(f"model {self.name!r}: linear-attention blocks must be block indices from 0 to "
                              f"{self.num_blocks - 1}, ascending")
        if not all(getattr(self, f) for f in sizes) if self.linear_blocks else any(getattr(self, f) for f in sizes):
            raise SailorError(f"model {self.name!r}: linear-attention blocks need all of {', '.join(sizes)}, and "
                              "those describe linear-attention blocks")
        if self.linear_blocks and self.linear_value_heads % self.linear_key_heads:
            raise SailorError(f"model {self.name!r}: {self.linear_value_heads} linear-attention value heads are not "
                              f"divisible by its {self.linear_key_heads} key heads")
        if self.attention_gate and self.latent:
            raise SailorError(f"model {self.name!r}: an output gate on latent attention is not supported")

    # -- shape helpers -------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.heads

    @property
    def rotary_dim(self) -> int:
        """Dimensions of a head that rotary positions rotate (the first ones; Hugging Face's
        int(head_dim * partial_rotary_factor); latent attention's: the last rope_head_dim)."""
        return self.rope_head_dim if self.latent else int(self.head_dim * self.rotary_fraction)

    @property
    def latent(self) -> bool:
        """Multi-head latent attention (kv_lora_rank)."""
        return self.kv_lora_rank > 0

    @property
    def context_dim(self) -> int:
        """Width of V and of the attention's context: heads * v_head_dim (latent attention), else q_dim."""
        return self.heads * self.v_head_dim if self.latent else self.q_dim

    def dense(self, block: int) -> bool:
        """Whether block `block` (0-based) of a mixture of experts has a dense MLP (dense_blocks)."""
        return block in self.dense_blocks

    def linear(self, block: int) -> bool:
        """Whether block `block` (0-based) is a Gated DeltaNet block (linear_blocks)."""
        return block in self.linear_blocks

    @property
    def linear_k_dim(self) -> int:
        """Width of a linear-attention block's q (and of its k): linear_key_heads * linear_key_dim."""
        return self.linear_key_heads * self.linear_key_dim

    @property
    def linear_v_dim(self) -> int:
        """Width of a linear-attention block's v (and of its gate z and output): heads * linear_value_dim."""
        return self.linear_value_heads * self.linear_value_dim

    @property
    def sparse_blocks(self) -> int:
        """Blocks with experts (the others of a mixture of experts are dense_blocks)."""
        return self.num_blocks - len(self.dense_blocks) if self.experts else 0

    @functools.cached_property
    def dense_view(self) -> "ModelSpec":
        """This model as its dense blocks see it: one MLP dense_ffn wide, no experts (their counts)."""
        return replace(self, experts=0, experts_per_token=0, shared_expert_ffn=0, router_bias=False, glu_limit=0.0,
                       router_sigmoid=False, expert_score_bias=False, expert_groups=1, expert_groups_per_token=1,
                       routed_scale=1.0, expert_input_weighted=False, dense_blocks=(), dense_ffn=0,
                       ffn_hidden=self.dense_ffn)

    @property
    def sink_dims(self) -> int:
        """Dimensions the runtime adds to each head's q and k to run attention sinks in fused kernels: the
        sink's, then zeros up to a multiple of 8 (sailor_ext.attention.sink_attention)."""
        return 8 - self.head_dim % 8 if self.attention_sinks else 0

    @property
    def q_dim(self) -> int:
        """Width of Q (and of the attention's context): heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads * head_dim."""
        return (self.kv_heads or self.heads) * self.head_dim

    @property
    def num_query_groups(self) -> int:
        return self.kv_heads or self.heads

    @property
    def word_dim(self) -> int:
        """Width of the word embedding (and of the head's input)."""
        return self.embed_dim or self.hidden

    @property
    def projected(self) -> bool:
        """True when the word embedding is narrower than the blocks (project_in/project_out)."""
        return self.word_dim != self.hidden

    @property
    def context_length(self) -> int:
        return self.max_positions or self.seq_len

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table (OPT keeps `position_offset` extra rows)."""
        return self.context_length + self.position_offset if self.learned_positions else 0

    @property
    def num_layers(self) -> int:
        """Pipeline layers: embedding + blocks (+ final norm) + head."""
        return self.num_blocks + 2 + (1 if self.separate_final_norm else 0)

    def kind(self, layer: int) -> str:
        if layer == 0:
            return EMBEDDING
        if layer <= self.num_blocks:
            return BLOCK
        if self.separate_final_norm and layer == self.num_blocks + 1:
            return FINAL_NORM
        return HEAD

    def window(self, block: int) -> int:
        """Attention window of block `block` (0-based); 0 means full causal attention."""
        return self.windows[block] if self.windows else 0

    def query_scaled(self, block: int) -> bool:
        """Whether block `block` (0-based) scales q by position (query_scale_beta) at this sequence length: the
        factor is 1 while p + offset < span."""
        return self.query_scale_beta > 0 and self.seq_len - 1 + self.query_scale_offset >= self.query_scale_span \
            and not self.linear(block) and (not self.query_scale_nope or block in self.nope_blocks)

    def chunk(self, block: int) -> int:
        """Attention chunk of block `block` (0-based) where it cuts this sequence length; 0: none."""
        return self.attention_chunk if 0 < self.attention_chunk < self.seq_len and self.rotary(block) else 0

    def rotary(self, block: int) -> bool:
        """Whether block `block` (0-based) rotates q and k by their positions."""
        return not self.learned_positions and not self.alibi and block not in self.nope_blocks and \
            not self.linear(block)

    def padded_vocab(self, tp: int) -> int:
        """Megatron pads the vocabulary to a multiple of vocab_divisor * tp."""
        step = self.vocab_divisor * tp
        return math.ceil(self.vocab / step) * step

    def tp_degrees(self, max_tp: int) -> list[int]:
        """TP degrees Megatron can use: powers of two dividing heads, kv heads and the FFN width."""
        kv = self.num_query_groups
        out, t = [], 1
        while t <= max_tp:
            if self.heads % t == 0 and kv % t == 0 and self.ffn_hidden % t == 0 and self.shared_expert_ffn % t == 0 \
                    and self.dense_ffn % t == 0 and self.linear_key_heads % t == 0:
                out.append(t)
            t *= 2
        return out

    # -- per-layer facts -----------------------------------------------------
    def _attention_weights(self) -> int:
        """Weights of QKV and the output projection (latent attention: its up-projections of q, k and v, split
        over TP with the heads, and the output projection)."""
        if self.latent:
            q_in = self.q_lora_rank or self.hidden
            kv_up = self.kv_lora_rank * self.heads * (self.head_dim - self.rope_head_dim + self.v_head_dim)
            return q_in * self.q_dim + kv_up + self.context_dim * self.hidden
        gate = self.q_dim if self.attention_gate else 0
        return self.hidden * (self.q_dim + gate + 2 * self.kv_dim) + self.q_dim * self.hidden

    def _linear_attention_weights(self) -> int:
        """Weights of a Gated DeltaNet, all split over TP with the heads: the projections to [q; k; v], to the
        output gate z and to each value head's beta and decay step, the convolution's taps over [q; k; v], each
        value head's decay rate and step bias, and the output projection."""
        qkv, v, heads = 2 * self.linear_k_dim + self.linear_v_dim, self.linear_v_dim, self.linear_value_heads
        return self.hidden * (qkv + v + 2 * heads) + qkv * self.linear_conv + 2 * heads + v * self.hidden

    def _latent_weights(self) -> int:
        """Latent attention's replicated down-projections, hidden -> q's latent and hidden -> [kv's latent; the
        shared rotary k] (0 for ordinary attention)."""
        return self.hidden * (self.q_lora_rank + self.kv_lora_rank + self.rope_head_dim) if self.latent else 0

    def _mlp_weights(self, ffn: int = 0) -> int:
        """Weights of one MLP (one expert's; ffn: another width, the shared expert's): fc1 (gate+up) and fc2."""
        ffn = ffn or self.ffn_hidden
        return (3 if self.gated_mlp else 2) * self.hidden * ffn

    def _mlp_matmul_weights(self) -> int:
        """Weights of a block's MLP matmuls split over TP: every expert's fc1 and fc2 and the shared expert's
        (the router and the shared expert's gate are replicated: params())."""
        shared = self._mlp_weights(self.shared_expert_ffn) if self.shared_expert_ffn else 0
        return max(1, self.experts) * self._mlp_weights() + shared

    @property
    def active_mlps(self) -> int:
        """MLPs each token passes through: 1, or experts_per_token of the experts."""
        return self.experts_per_token if self.experts else 1

    def _mlp_in(self) -> int:
        return (2 if self.gated_mlp else 1) * self.ffn_hidden

    def _norm_params(self) -> int:
        return 0 if not self.norm_weight else self.hidden if self.rms_norm or not self.norm_bias else 2 * self.hidden

    @property
    def block_norms(self) -> int:
        """Norms over the hidden width in a block: before each sublayer (one for both with shared_norm;
        none without input_norms), and after each with sandwich_norm."""
        before = (1 if self.shared_norm else 2) if self.input_norms else 0
        return before + (2 if self.sandwich_norm else 0)

    def params(self, layer: int, tp: int = 1, padded: bool = True) -> int:
        """Parameters one GPU of a TP group holds for `layer` (padded=False: the
        vocabulary as the tokenizer has it, as transformers counts)."""
        h, kind = self.hidden, self.kind(layer)
        vocab = self.padded_vocab(tp) // tp if padded else self.vocab / tp
        projection = self.word_dim * h if self.projected else 0
        if kind == EMBEDDING:
            own_norm = self._norm_params() if self.embedding_norm else 0
            return int(vocab * self.word_dim) + projection + self.position_rows * h + own_norm
        if kind == FINAL_NORM:
            return self._norm_params()
        if kind == HEAD:
            own_norm = self._norm_params() if self.final_norm and not self.separate_final_norm else 0
            if self.tied_embeddings:
                return own_norm + projection  # the head reuses the embedding matrix
            return int(vocab * (self.word_dim + self.head_bias)) + own_norm + projection
        # transformer block
        if self.dense(layer - 1):
            return self.dense_view.params(layer, tp, padded)
        sharded, replicated = self._attention_params(layer - 1)
        sharded += self._mlp_matmul_weights()
        # the norms; DeepSeek's expert score biases (E values, fixed: a buffer in transformers, a tensor of the
        # checkpoint, a parameter of DeepSeek's own code and ours)
        replicated += self.block_norms * self._norm_params() + self.experts * self.expert_score_bias
        # the router, the shared expert's gate
        replicated += self.experts * h + (h if self.shared_expert_ffn and self.shared_expert_gated else 0)
        replicated += self.experts if self.router_bias else 0
        replicated += 2 if self.activation == "xielu" else 0  # (xIELU's trained scalars; transformers keeps its two
        # fixed ones as buffers)
        if self.mlp_bias:  # (each expert's)
            sharded += max(1, self.experts) * self._mlp_in()
            replicated += max(1, self.experts) * h  # fc2's bias, added after the row-parallel all-reduce
        return sharded // tp + replicated

    def _attention_params(self, block: int) -> tuple[int, int]:
        """(split over TP, replicated) parameters of block `block`'s attention (0-based)."""
        if self.linear(block):  # the output norm's weight, over one value head, shared by all heads
            return self._linear_attention_weights(), self.linear_value_dim
        # latent attention's down-projections and its latents' norms
        sharded, replicated = self._attention_weights(), self._latent_weights() + self.q_lora_rank + self.kv_lora_rank
        if self.qk_norm_full or self.qk_norm_per_head:
            sharded += self.q_dim + self.kv_dim  # two norm weights as wide as q and k, split with the heads
        elif self.qk_norm:
            replicated += 2 * self.head_dim  # two RMSNorm weights, each shared by all heads of q (of k)
        if self.attention_sinks:
            sharded += self.heads  # one logit per head, split with the heads
        if self.qkv_bias:
            sharded += self.q_dim * (2 if self.attention_gate else 1) + 2 * self.kv_dim  # column-parallel
        return sharded, replicated + (self.hidden if self.out_bias else 0)

    def total_params(self, padded: bool = True) -> int:
        return sum(self.params(layer, 1, padded) for layer in range(self.num_layers))

    def activation_floats(self, layer: int, tp: int = 1) -> float:
        """Floats per token that the forward pass keeps for backward (one sample).

        Embedding: its output, h (and the embedding norm's input, h).
        Block: 3h replicated (norm inputs, residual) + (q,k,v + context + MLP
        intermediate)/tp + heads*seq/tp (softmax probabilities; no flash
        attention), + (q + k)/tp with per-head q/k norms (their inputs). This
        reproduces Sailor's measured llm_info for OPT-350 at TP 1, 2, 4 and 8.
        Sandwich norms add their inputs, 2h; a softcap keeps its tanh, heads*seq/tp.
        Head: the logits and their softmax, 2*V/tp, plus the final norm's
        input (and the softcap's tanh, V/tp). A projection keeps its input too (word_dim). A
        mixture of experts keeps what moe_activation_floats counts (16-bit) in place of the MLP's f_in/tp.
        """
        h, kind = self.hidden, self.kind(layer)
        extra = self.word_dim if self.projected else 0
        if kind == EMBEDDING:
            return float(h + extra + (h if self.embedding_norm else 0))
        if kind == FINAL_NORM:
            return float(h)
        if kind == HEAD:
            return (3.0 if self.logit_softcap else 2.0) * self.padded_vocab(tp) / tp + 1.25 * h + extra
        if self.dense(layer - 1):
            return self.dense_view.activation_floats(layer, tp)
        mlp = 0 if self.experts else self._mlp_in()
        moe = self.moe_activation_floats(tp, 2) if self.experts else 0.0
        if self.linear(layer - 1):
            return (3.0 + self.block_norms - 2) * h + mlp / tp + moe + self.linear_attention_floats(tp, 2)
        sharded = (self.q_dim + 2 * self.kv_dim) + self.q_dim + mlp + self.heads * self.seq_len
        latent = 0.0
        if self.latent:  # q, k, v and the context; each latent's norm (input, normalised, output), the rotary k
            sharded += 2 * (self.context_dim - self.kv_dim)  # (v and the context as wide as the context)
            latent = 3 * (self.q_lora_rank + self.kv_lora_rank) + self.rope_head_dim
        if self.qk_norm or self.qk_l2_norm and self.rotary(layer - 1):
            sharded += self.q_dim + self.kv_dim  # the q and k norms' inputs
        if self.attn_softcap:
            sharded += self.heads * self.seq_len  # tanh's output, for its backward
        return (3.0 + self.block_norms - 2) * h + sharded / tp + moe + latent

    def linear_attention_floats(self, tp: int, dtype_bytes: int) -> float:
        """Values (of `dtype_bytes` each) per token that a Gated DeltaNet keeps beyond its input, as
        sailor_ext/linear_attention.py runs it (autograd's saved tensors, fp32 and bf16 on CPU:
        tests/runtime/test_units.py), per TP rank, with C = [q; k; v]'s width, H value heads of d_k, d_v, H_k key
        heads, chunks of c tokens, v = H d_v, f = 4/b for the values kept in fp32:

            convolution    its input and output (taps - 1 columns longer than the sequence), 2C; in fp32
                           also the SiLU's output, C (q, k and v are views of it)
            the rule (fp32)  q and k's norms 2H_k; per value head beta, the decay step's input and
                           output, three decays and the output norm's 1/rms, 7, and the chunk's decay,
                           1/c; per head and token the chunk's pairwise decays, K K^T and the solve's
                           system, Q K^T and the scores, 5c; ten copies of q or k wide (k as repeated,
                           the keys weighed by beta and decayed, q, q decayed, the keys decayed to the
                           chunk's end, and the copies batched matmuls make), 10 d_k; four of v wide,
                           4 d_v; the chunk's state, d_k d_v / c
            output norm    the normalised output, it times the weight, z, SiLU(z), the product, 5v;
                           16-bit: the first two, z and SiLU(z) in fp32 and the product cast, 3v + 2vf
            16-bit         q and k in fp32 before their norms, 2 H_k d_k f; beta before its cast, H
        """
        f, c, t, wide = 4 / dtype_bytes, DELTA_CHUNK, tp, dtype_bytes == 4
        heads, key_heads, dk, dv = self.linear_value_heads / t, self.linear_key_heads / t, self.linear_key_dim, \
            self.linear_value_dim
        channels, v = (2 * self.linear_k_dim + self.linear_v_dim) / t, self.linear_v_dim / t
        conv = channels * (2 + wide + (self.linear_conv - 1) / self.seq_len)
        rule = 2 * key_heads + heads * (7 + 1 / c + 5 * c + 10 * dk + 4 * dv + dk * dv / c)
        norm = 5 * v if wide else 3 * v + 2 * v * f
        casts = 0.0 if wide else 2 * key_heads * dk * f + heads
        return conv + rule * f + norm + casts

    def moe_activation_floats(self, tp: int, dtype_bytes: int) -> float:
        """Values (of `dtype_bytes` each) per token that a mixture-of-experts MLP keeps beyond its input,
        as sailor_ext/moe.py runs it (autograd's saved tensors; tests/runtime/test_units.py):

            router         its input's copy h, the fp32 probabilities 4E/b, the chosen experts and
                           their order 2 * 8k/b (int64), with renormalisation the chosen
                           probabilities and their sum 4(k + 1)/b
            each of the k  the expert's input h, its output h and the weighted output h (replicated
            experts        over TP); fc1's output, the activation's and the product, 4f/t (SwiGLU;
                           2f/t plain); its routing weight 4/b and token index 8/b
            shared expert  fc1's output, the activation's and the product, 4f_s/t (2f_s/t plain), its
                           output h and its gate's sigmoid, 1 (GraniteMoeShared: no gate)
            gpt-oss        the clamped GLU keeps 7f/t in place of 4f/t; fc2's biases, one of h per
                           chosen expert, and the routing weights once more, 4k/b
        """
        h, e, k, f, b = self.hidden, self.experts, self.experts_per_token, self.ffn_hidden, dtype_bytes
        mlp = 4 if self.gated_mlp else 2
        if self.glu_limit:  # fc1's output, the clamped gate, its sigmoid, the gate's product, up + 1, the output
            mlp = 7
        router = h + 4 * e / b + 16 * k / b + (4 * (k + 1) / b if self.expert_renorm else 0)
        shared = mlp * self.shared_expert_ffn / tp + h + self.shared_expert_gated if self.shared_expert_ffn else 0.0
        # fc2's bias of each chosen expert, gathered to be weighted, and the weights (fp32) that weight them
        biases = k * (h + 4 / b) if self.mlp_bias else 0.0
        return router + k * (3 * h + mlp * f / tp + 12 / b) + shared + biases

    def _delta_rule_flops(self) -> float:
        """Forward FLOPs per token of the gated delta rule (sailor_ext/linear_attention.py), chunks of C =
        DELTA_CHUNK tokens, per value head with q/k width d_k and v width d_v:

            within its chunk   K K^T and Q K^T, 2 * 2 C d_k; the triangular solves for the corrected values
                               and the decayed keys, C (d_k + d_v); the chunk's scores times the values, 2 C d_v
            against the state  the decayed keys' read of it, q's read, the update: 3 * 2 d_k d_v
        """
        c, dk, dv = DELTA_CHUNK, self.linear_key_dim, self.linear_value_dim
        return self.linear_value_heads * (4.0 * c * dk + c * (dk + dv) + 2.0 * c * dv + 6.0 * dk * dv)

    def output_floats(self, layer: int) -> int:
        """Floats per token a layer hands to the next one (the p2p payload)."""
        return 1 if self.kind(layer) == HEAD else self.hidden

    def forward_flops(self, layer: int) -> float:
        """Forward FLOPs per token of the whole layer (all TP ranks together)."""
        kind = self.kind(layer)
        if kind == BLOCK and self.dense(layer - 1):
            return self.dense_view.forward_flops(layer)
        if kind == BLOCK:  # the matmuls of attention, of each MLP a token passes through and the router; QK^T, AV
            shared = self._mlp_weights(self.shared_expert_ffn) + self.hidden * self.shared_expert_gated \
                if self.shared_expert_ffn else 0
            mlp = 2.0 * (self.active_mlps * self._mlp_weights() + self.experts * self.hidden + shared)
            if self.linear(layer - 1):
                return mlp + 2.0 * self._linear_attention_weights() + self._delta_rule_flops()
            return mlp + 2.0 * (self._attention_weights() + self._latent_weights()) + \
                2.0 * self.seq_len * (self.q_dim + self.context_dim)
        if kind == HEAD:
            projection = 2.0 * self.word_dim * self.hidden if self.projected else 0.0
            return 2.0 * self.word_dim * self.padded_vocab(1) + projection
        return 0.0

    # -- identity ------------------------------------------------------------
    def to_dict(self) -> dict:
        """Every field, JSON-ready (plans and checkpoints carry this)."""
        d = asdict(self)
        d["windows"] = list(self.windows)
        d["nope_blocks"] = list(self.nope_blocks)
        d["dense_blocks"] = list(self.dense_blocks)
        d["linear_blocks"] = list(self.linear_blocks)
        d["rope_scaling"] = dict(self.rope_scaling)
        return d

    def architecture(self) -> "ModelSpec":
        """The same model without what does not change a layer's time or memory (its name,
        norm epsilon, rotary base and scaling, padding token): two specs with equal
        architecture() have the same layers, so measured profiles of one apply to the other."""
        return replace(self, name="", hf_model_type="", norm_eps=0.0, rope_theta=0.0, rope_scaling=(), pad_token=-1,
                       local_rope_theta=0.0)


_SCALARS = {"int": int, "bool": bool, "float": (int, float), "str": str}  # field annotation -> JSON types it takes


def model_from_dict(d: dict, source: str = "model description") -> ModelSpec:
    """A ModelSpec from `ModelSpec.to_dict()` output (a plan's or checkpoint's model)."""
    if not isinstance(d, dict):
        raise SailorError(f"{source}: expected a JSON object with the model's fields")
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise SailorError(f"{source}: unknown model field {unknown[0]!r}; it was written by another sailor version "
                          "or edited by hand")
    for f in fields(ModelSpec):
        expected = _SCALARS.get(f.type)
        value = d.get(f.name)
        if expected is not None and f.name in d and (not isinstance(value, expected) or
                                                     (isinstance(value, bool) and expected is not bool)):
            raise SailorError(f"{source}: malformed model description ({f.name} must be {f.type}, not "
                              f"{short(value)})")
    if "family" in d:
        from planner.specs.families import family

        try:
            family(d["family"])
        except SailorError as e:
            raise SailorError(f"{source}: {e}") from None
    d = dict(d)
    try:
        for key in ("windows", "nope_blocks", "dense_blocks", "linear_blocks"):
            if key in d:
                if not isinstance(d[key], list):
                    raise ValueError(f"{key} must be a list, not {short(d[key])}")
                d[key] = tuple(d[key])
        if "rope_scaling" in d:
            def number(v) -> bool:
                return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= FLOAT_MAX

            if not isinstance(d["rope_scaling"], dict) or not all(
                    isinstance(v, str) or number(v) or (isinstance(v, list) and all(number(x) for x in v))
                    for v in d["rope_scaling"].values()):
                raise ValueError("rope_scaling must be an object of names, numbers and lists of numbers, not "
                                 f"{short(d['rope_scaling'])}")
            d["rope_scaling"] = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                             for k, v in d["rope_scaling"].items()))
        return ModelSpec(**d)
    except SailorError as e:  # a field out of range: say which file holds it
        raise SailorError(f"{source}: {e}") from None
    except TypeError as e:
        raise SailorError(f"{source}: malformed model description ({e})") from None
    except ValueError as e:
        raise SailorError(f"{source}: malformed model description ({e})") from None


# -- presets ------------------------------------------------------------------
# Megatron-style shapes of the runs behind Sailor's published profiles: OPT and
# GPT-Neo sizes from their Hugging Face configs, but built the way those
# Megatron-DeepSpeed runs built them (pre-LN GELU blocks with all biases,
# untied OPT head without projection, vocabulary padded to 128 * tp), at their
# sequence lengths. A model's own config.json gives its exact Hugging Face
# architecture instead. `tiny` is for CPU tests.
def _megatron(name, family, hidden, blocks, heads, ffn, vocab, seq_len, **kw) -> ModelSpec:
    return ModelSpec(name, family, hidden, blocks, heads, ffn, vocab, seq_len, max_positions=seq_len, **kw)


_PRESETS = {
    "tiny": _megatron("tiny", "opt", hidden=64, blocks=4, heads=4, ffn=256, vocab=512, seq_len=64),
    "opt-125m": _megatron("opt-125m", "opt", 768, 12, 12, 3072, 50272, 2048),
    "opt-350m": _megatron("opt-350m", "opt", 1024, 24, 16, 4096, 50272, 2048),
    "opt-1.3b": _megatron("opt-1.3b", "opt", 2048, 24, 32, 8192, 50272, 2048),
    "opt-6.7b": _megatron("opt-6.7b", "opt", 4096, 32, 32, 16384, 50272, 2048),
    "opt-30b": _megatron("opt-30b", "opt", 7168, 48, 56, 28672, 50272, 2048),
    "gpt2": _megatron("gpt2", "gpt2", 768, 12, 12, 3072, 50257, 1024, tied_embeddings=True),
    "gpt-neo-2.7b": _megatron("gpt-neo-2.7b", "gpt-neo", 2560, 32, 20, 10240, 50257, 2048, tied_embeddings=True),
    # Sailor's LLAMA-3-8 run is LLaMA-3-8B's depth and width on a GPT-style Megatron build: full
    # multi-head attention, a SwiGLU of 16384 with biases, GPT-2's 50257-token vocabulary with a
    # tied head (llm_info.json's counts say so). Meta's Llama-3-8B is its config.json.
    "llama-3-8b": _megatron(
        "llama-3-8b", "llama", 4096, 32, 32, 16384, 50257, 8192, tied_embeddings=True, gated_mlp=True,
        rms_norm=True, learned_positions=False, separate_final_norm=True, activation="silu",
    ),
}
# Sailor's names for the same models (its profiles and plans use these).
ALIASES = {
    "OPT-350": "opt-350m",
    "OPT-30": "opt-30b",
    "GPT-Neo-2.7": "gpt-neo-2.7b",
    "LLAMA-3-8": "llama-3-8b",
    "opt-350": "opt-350m",
    "opt-30": "opt-30b",
    "gpt-neo-2.7": "gpt-neo-2.7b",
    "llama-3-8": "llama-3-8b",
}
SAILOR_NAMES = {v: k for k, v in ALIASES.items() if k.isupper() or k[0].isupper()}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def canonical_name(name: str) -> str:
    return ALIASES.get(name, ALIASES.get(name.upper(), name.lower() if name.lower() in _PRESETS else name))


def is_preset(name: str) -> bool:
    return canonical_name(name) in _PRESETS


def check_seq_length(seq_len: int | None) -> None:
    """A --seq-length (None: not given) must be a positive number of tokens."""
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0):
        raise SailorError(f"--seq-length {seq_len} must be a positive number of tokens")


def get_model(name_or_path: str, seq_len: int | None = None) -> ModelSpec:
    """A preset by name or alias, a Hugging Face config.json (or a directory holding one), or the
    model of one of our plan files.

    seq_len: the training sequence length; default: a preset's own, or for a
    config.json min(2048, its context length).
    """
    check_seq_length(seq_len)
    if not name_or_path.strip():
        raise SailorError("the model name is empty: give a preset (`sailor list models`), a config.json or a model "
                          "directory")
    key = canonical_name(name_or_path)
    if key in _PRESETS:
        model = _PRESETS[key]
        return replace(model, seq_len=seq_len) if seq_len else model  # its context stays what it was built for
    if name_or_path.endswith(".json") or Path(name_or_path).is_dir():
        from planner.specs.families import from_hf_config, read_config

        if read_config(name_or_path)[0].get("format") == "sailor-plan":  # a plan of ours names or carries its model
            from planner.specs.plan import load_plan, plan_model

            return plan_model(load_plan(name_or_path), seq_len=seq_len)
        return from_hf_config(name_or_path, seq_len)
    raise SailorError(
        f"unknown model {name_or_path!r}: use a Hugging Face config.json or model directory, or one of the "
        f"Megatron-style presets of Sailor's runs: {', '.join(preset_names())} (Sailor's names OPT-350, "
        "GPT-Neo-2.7, LLAMA-3-8, OPT-30 work too)"
    )


def is_preset_spec(spec: ModelSpec) -> bool:
    """True when `spec` is a preset (at any sequence length): its name alone describes it."""
    preset = _PRESETS.get(canonical_name(spec.name))
    return preset is not None and spec.seq_len <= preset.context_length and \
        replace(preset, seq_len=spec.seq_len) == spec


def seq_length_reason(spec: ModelSpec, flag: int | None = None, planned: int | None = None) -> str:
    """Where spec.seq_len came from, for the output: a plan, --seq-length, or the default."""
    if planned is not None:
        return "the plan's"
    if flag is not None:
        return "--seq-length"
    if is_preset_spec(spec):
        return f"default: {spec.name}'s own; set --seq-length"
    return f"default: min({DEFAULT_SEQ_LEN}, context {spec.context_length}); set --seq-length"
