"""Model families: how a Hugging Face config and its weights map onto a ModelSpec.

One module per family (llama.py covers LLaMA, Mistral, Ministral, Ministral 3, Qwen2, Qwen3, Granite, SmolLM3,
ERNIE 4.5, Seed-OSS, Helium, CWM, InternLM3 and IQuest-Coder; moe.py Mixtral, Qwen2/3-MoE, OLMoE, ERNIE-4.5-MoE,
MiniMax-M2, GraniteMoE and FlexOlmo; olmo.py OLMo 1, 2 and 3; gemma.py Gemma 1, 2 and 3 and VaultGemma; cohere.py
Cohere 1 and 2; glm.py GLM-4 and GLM-4-0414; glm_moe.py GLM-4.5, Solar Open and dots.llm1; exaone.py EXAONE 3, 4 and
K-EXAONE; gpt_oss.py; deepseek.py DeepSeek-V2 and V3, GLM-4.7-Flash, Mistral 4, Youtu-LLM and MiniCPM3; llama4.py
Llama 4; hunyuan.py HunYuan dense and MoE; qwen3_5.py Qwen3.5, Qwen3.5-MoE and Qwen3-Next; falcon.py Falcon-7B, 11B,
40B and 180B; nemotron.py Nemotron and Jais 2; nanochat.py; hyperclovax.py; granite_swa.py Granite SWA and GraniteMoE
SWA; arcee.py; apertus.py; phi.py, phi3.py, stablelm.py, starcoder2.py, gptj.py, gpt_neox.py, opt.py, gpt2.py (GPT-2,
GPTBigCode), gpt_neo.py). Multimodal configs are read as their language model (MULTIMODAL). Each holds, as data,
everything family-specific:

  * `from_hf(cfg)`: the ModelSpec fields a config.json sets;
  * `to_hf(spec)`: the config.json fields that describe the spec back to
    transformers (export);
  * `WEIGHTS`: for every logical tensor of ours (named per pipeline layer kind,
    as sailor_ext/model.py builds them), the Hugging Face tensor(s) it comes
    from and the conversion between the two layouts (WeightRule.op).

The planner reads the fields for its counts, the runtime reads them to pick
megatron-core modules, and the checkpoint code reads WEIGHTS (sailor_ext/hf.py);
nothing else knows Hugging Face names. No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from planner.errors import SailorError
from planner.inputs import FLOAT_MAX, parse_json, read_text, short
from planner.specs.model import DEFAULT_SEQ_LEN, ModelSpec


@dataclass(frozen=True)
class WeightRule:
    """One logical tensor of ours and the Hugging Face tensor(s) it is made of.

    ours: the name inside its pipeline layer (`layers.<L>.` is prepended);
    hf: Hugging Face names, `{i}` standing for the 0-based block index (and `{e}` for the expert's, `{h}` and `{g}`
        for the query head's and the key/value head's);
    op: how the layouts differ:
      copy       the same tensor
      t          transposed (GPT-2's Conv1D keeps weights as [in, out])
      row        a vector kept as a matrix of one row, [1, n] -> [n] (ERNIE 4.5's expert score biases)
      qkv        q, k, v (Linear weights or biases) -> megatron's fused QKV, grouped by
                 query group: [q heads of group g, k_g, v_g] for each group g
      qkv_cat    one tensor holding [q; k; v] along its output rows -> the same grouping
      qkv_cat_t  as qkv_cat, from a Conv1D weight [in, 3 * out]
      gate_up    gate and up projections -> fc1 viewed as [2, ffn, ...] (SwiGLU)
      gate_up_cat  one tensor holding [gate; up] along its rows -> the same
      vocab      the word embedding or output layer: rows beyond the vocabulary are
                 padding that the runtime adds (and export drops)
      experts    one tensor per expert -> all of them stacked, [E, ...]
      heads      one tensor per head ({h}: query heads, {g}: key/value heads) -> all of them stacked, [heads, ...]
      experts_gate_up  each expert's gate and up projections -> [E, 2, ffn, h]
      experts_gate_up_cat  all experts' fc1 stacked, each holding [gate; up] along its rows:
                 [E, 2 ffn, h] -> [E, 2, ffn, h]
      experts_t  all experts' tensors stacked, each as x @ W: [E, in, out] -> [E, out, in]
      experts_gate_up_t  all experts' fc1 as x @ W, the gate's columns then up's: [E, h, 2 ffn] -> [E, 2, ffn, h]
      experts_gate_up_alternating  all experts' fc1 as x @ W with gate and up columns alternating,
                 [E, h, 2 ffn] -> [E, 2, ffn, h] (its bias [E, 2 ffn] -> [E, 2, ffn])
      qkv_gated  q_proj holding each head's [q; gate], k, v -> megatron's fused QKV with an output
                 gate, [q heads of group g, their gates, k_g, v_g] for each group g
      delta_qkv  Gated DeltaNet's [q; k; v] rows (or convolution taps) -> ours grouped by key head,
                 [q_g, k_g, v_g] for each key head g (sailor_ext/linear_attention.py)
      qkvz_qkv, qkvz_z, ba_b, ba_a  one span of the rows of each key head's group in a tensor of
                 groups [q_g, k_g, v_g, z_g] (or [b_g, a_g]): Qwen3-Next's (exported, the spans of one
                 tensor are put together)
    """

    ours: str
    hf: tuple[str, ...]
    op: str = "copy"
    # which blocks of a mixture of experts with dense blocks among the sparse (ModelSpec.dense_blocks) it names:
    # "dense", "sparse", or "" for every block
    blocks: str = ""


@dataclass(frozen=True)
class WeightMap:
    embedding: tuple[WeightRule, ...]
    block: tuple[WeightRule, ...]
    final_norm: tuple[WeightRule, ...]
    head: tuple[WeightRule, ...]


@dataclass(frozen=True)
class Family:
    name: str
    hf_types: tuple[str, ...]
    from_hf: Callable[[dict, str], dict]  # (config, model_type) -> ModelSpec fields
    to_hf: Callable[[ModelSpec], dict]
    weights: WeightMap


def _families() -> dict[str, Family]:
    from planner.specs.families import (apertus, arcee, bloom, cohere, deepseek, exaone, falcon, gemma, glm, glm_moe,
                                        gpt2, gpt_neo, gpt_neox, gpt_oss, gptj, granite_swa, hunyuan, hyperclovax,
                                        llama, llama4, moe, nanochat, nemotron, olmo, opt, phi, phi3, qwen3_5, stablelm,
                                        starcoder2)

    return {f.name: f for f in (llama.FAMILY, moe.MIXTRAL, moe.QWEN2_MOE, moe.QWEN3_MOE, moe.OLMOE, moe.GRANITE_MOE,
                                moe.MINIMAX_M2, moe.ERNIE_MOE, moe.FLEX_OLMO, exaone.EXAONE_MOE, deepseek.YOUTU,
                                olmo.FAMILY, olmo.OLMO1, phi.FAMILY, phi3.FAMILY, gemma.FAMILY, gemma.FAMILY2,
                                starcoder2.FAMILY, cohere.FAMILY, glm.FAMILY, glm_moe.FAMILY, exaone.FAMILY,
                                exaone.EXAONE3, gpt_oss.FAMILY, deepseek.FAMILY, deepseek.MISTRAL4, arcee.FAMILY,
                                qwen3_5.FAMILY, qwen3_5.MOE_FAMILY, qwen3_5.NEXT_FAMILY, llama4.FAMILY, hunyuan.FAMILY,
                                hunyuan.MOE_FAMILY, opt.FAMILY, stablelm.FAMILY, nemotron.FAMILY, nemotron.JAIS2,
                                nanochat.FAMILY, hyperclovax.FAMILY, granite_swa.FAMILY, granite_swa.MOE_FAMILY,
                                bloom.FAMILY, apertus.FAMILY, gptj.FAMILY, falcon.FAMILY, falcon.FALCON_40B,
                                gpt2.FAMILY, gpt2.BIGCODE, gpt_neo.FAMILY, gpt_neox.FAMILY)}


def family(name: str) -> Family:
    families = _families()
    if name not in families:
        raise SailorError(f"model family {name!r} is unknown; use one of {', '.join(sorted(families))}")
    return families[name]


def hf_types() -> list[str]:
    return sorted([t for f in _families().values() for t in f.hf_types] + list(MULTIMODAL))


# -- reading config.json ----------------------------------------------------------
class ConfigReader:
    """Typed access to a config.json's fields: every mistake names the file and field."""

    def __init__(self, cfg: dict, source: str):
        self.cfg, self.source = cfg, source

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int(self, key: str, default: int | None = None, hi: int | None = None) -> int:
        """A positive integer (8 or 8.0); `hi` caps a field that sizes a list before the ModelSpec checks it."""
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                raise SailorError(f"model config {self.source}: missing field {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not value.is_integer()) or value <= 0:
            raise SailorError(f"model config {self.source}: {key} must be a positive integer, not {short(value)}")
        if hi is not None and value > hi:
            raise SailorError(f"model config {self.source}: {key} {short(value)} is beyond {hi}, larger than any "
                              "model sailor can plan; check the value")
        return int(value)

    def float(self, key: str, default: float) -> float:
        value = self.cfg.get(key)
        return default if value is None else self.number(key, value)

    def number(self, name: str, value) -> float:
        """`value` (a field's, or one nested in an object such as rope_parameters) as a positive number."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= FLOAT_MAX:
            raise SailorError(f"model config {self.source}: {name} must be a positive number, not {short(value)}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SailorError(f"model config {self.source}: {key} must be true or false, not {short(value)}")
        return value

    def str(self, key: str, default: str) -> str:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise SailorError(f"model config {self.source}: {key} must be a string, not {short(value)}")
        return value

    def pad_token(self, default: int | None) -> int:
        """pad_token_id (-1: none): Hugging Face keeps its embedding row out of training."""
        value = self.cfg.get("pad_token_id", default)
        if value is None:
            return -1
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SailorError(f"model config {self.source}: pad_token_id must be a token id, not {short(value)}")
        return value

    def activation(self, key: str, default: str) -> str:
        name = self.str(key, default)
        ours = HF_ACTIVATIONS.get(name)
        if ours is None:
            raise SailorError(f"model config {self.source}: {key} {short(name)} is not supported; use one of "
                              f"{', '.join(sorted(HF_ACTIVATIONS))}")
        return ours


# Hugging Face activation names -> ours (gelu_new and gelu_pytorch_tanh are the tanh approximation)
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                  "relu": "relu", "relu2": "relu2", "silu": "silu", "swish": "silu", "xielu": "xielu"}
ACTIVATION_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "relu2": "relu2", "silu": "silu",
                    "xielu": "xielu"}


def read_config(path: str | Path) -> tuple[dict, Path]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise SailorError(f"model config {p} not found: give a preset name, a config.json or a model directory")
    cfg = parse_json(read_text(p, "model config"), f"model config {p}")
    if not isinstance(cfg, dict):
        raise SailorError(f"model config {p}: expected a JSON object")
    return cfg, p


def from_hf_config(path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (or a model directory holding one).

    seq_len: the training sequence length; default min(2048, the context length).
    """
    cfg, p = read_config(path)
    model_type, source = cfg.get("model_type"), str(p)
    if isinstance(model_type, str) and model_type in MULTIMODAL:
        cfg, model_type, source = _language_model(cfg, model_type, source)
        if model_type in TEXT_ALIASES:  # (the text type's defaults, then the causal LM's beneath them)
            alias, fixed = TEXT_ALIASES[model_type]
            cfg = {**HF_DEFAULTS.get(model_type, {}), **cfg, **fixed, "model_type": alias}
            model_type = alias
    fam = next((f for f in _families().values() if model_type in f.hf_types), None)
    if fam is None:
        raise SailorError(f"model config {p}: model_type {short(model_type)} is not supported; use one of "
                          f"{', '.join(hf_types())}")
    name = cfg.get("_name_or_path")
    if not isinstance(name, str) or not name.strip():
        name = p.parent.name or p.stem
    elif len(name) > 1000:  # the plan names the model by it, and plans take names up to 1000 characters
        raise SailorError(f"model config {p}: _name_or_path is {len(name)} characters long, beyond the 1000 a plan "
                          "takes; shorten it (it names the model in plans)")
    elif not name.isprintable():
        raise SailorError(f"model config {p}: _name_or_path {short(name)} has a line break, tab or control "
                          "character; remove it (it names the model in plans and tables)")
    cfg = {**HF_DEFAULTS.get(model_type, {}), **cfg}  # (a field set to null stays null, as transformers keeps it)
    cfg.update({field: cfg[alias] for alias, field in FIELD_ALIASES.get(model_type, {}).items() if alias in cfg})
    spec_fields = {"family": fam.name, **fam.from_hf(ConfigReader(cfg, source), model_type)}  # (a reader may name a
    # variant family of its own whose tensors have other names: Falcon-40B's)
    context = spec_fields["max_positions"]
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, context)
    return ModelSpec(name=name, seq_len=seq_len, hf_model_type=model_type, **spec_fields)


def _language_model(cfg: dict, model_type: str, source: str) -> tuple[dict, str, str]:
    """The language model's config of a multimodal config: its text_config, named by the outer config (the
    vision tower's fields are not read), with the outer tie_word_embeddings where it has one. transformers 5 ties
    by the outer field (default true for mistral3) but unties a checkpoint that holds its own lm_head, as Mistral's
    published ones do (saved by transformers 4, which read the text config's); so without the outer field, the
    text config's (or its model type's default) decides."""
    text_types, missing = MULTIMODAL[model_type]
    text = cfg.get("text_config")
    if text is None:  # (Qwen2-VL's and Qwen2.5-VL's published configs keep the language model's fields beside the
        # vision_config)
        text = {k: v for k, v in cfg.items() if k not in ("model_type", "vision_config")} if missing is None \
            else missing
    if not isinstance(text, dict):
        raise SailorError(f"model config {source}: text_config must be an object, not {short(text)}")
    text_type = text.get("model_type", text_types[0])
    if text_type not in text_types:
        raise SailorError(f"model config {source}: text_config's model_type {short(text_type)} is not supported "
                          f"in a {model_type} config; use {' or '.join(text_types)}")
    text = {**text, "model_type": text_type, "_name_or_path": cfg.get("_name_or_path")}
    if cfg.get("tie_word_embeddings") is not None:
        text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return text, text_type, f"{source} text_config"


# config.json fields of dropout probabilities, by transformers' names across families
DROPOUT_FIELDS = ("dropout", "attention_dropout", "hidden_dropout", "activation_dropout", "resid_pdrop", "embd_pdrop",
                  "attn_pdrop", "embed_dropout", "resid_dropout", "residual_dropout", "embedding_dropout",
                  "hidden_dropout_prob", "attention_probs_dropout_prob", "ffn_dropout", "layerdrop")


def _config_file(name_or_path: str) -> tuple[dict, Path] | None:
    """A model's config.json (and its path) where `name_or_path` names one or its directory; None for a preset."""
    p = Path(name_or_path)
    if not (p / "config.json").is_file() and not (p.suffix == ".json" and p.is_file()):
        return None
    return read_config(p)


def unapplied_dropout(name_or_path: str) -> dict[str, float]:
    """The dropout probabilities above 0 that a model's config.json sets (also in its text_config), which sailor's
    runtime does not apply: it trains without dropout. {} for a preset, or a config without any."""
    cfg, _ = _config_file(name_or_path) or ({}, None)
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return {key: float(value) for c in (cfg, text) for key in DROPOUT_FIELDS
            if isinstance(value := c.get(key), (int, float)) and not isinstance(value, bool) and value > 0}


def multimodal_note(name_or_path: str) -> str | None:
    """What sailor does with a multimodal checkpoint's model (None for any other): its language model alone."""
    cfg, path = _config_file(name_or_path) or ({}, None)
    if not isinstance(cfg.get("model_type"), str) or cfg["model_type"] not in MULTIMODAL:
        return None
    return (f"{path} is a multimodal {cfg['model_type']} model: sailor plans and trains its language model on text; "
            "the vision tower is neither loaded nor trained, and export writes the language model alone")


def to_hf_config(spec: ModelSpec) -> dict:
    """config.json fields that make transformers build `spec` (export)."""
    fam = family(spec.family)
    cfg = fam.to_hf(spec)
    cfg.setdefault("architectures", [_ARCHITECTURES[cfg["model_type"]]])
    cfg.setdefault("tie_word_embeddings", spec.tied_embeddings)
    return cfg


# transformers' defaults (its config classes', 5.24) for fields a config.json leaves out, where they differ from
# what the family's reader assumes (LLaMA's for the families built on llama.from_hf)
HF_DEFAULTS = {
    "mistral": {"num_key_value_heads": 8, "sliding_window": 4096}, "mixtral": {
        "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e6}, "qwen3_moe": {"num_key_value_heads": 4},
    "qwen2_moe": {"num_key_value_heads": 16},
    "olmo2": {"rms_norm_eps": 1e-5}, "olmo3": {"rms_norm_eps": 1e-5}, "olmoe": {"rms_norm_eps": 1e-5},
    "gemma": {"num_key_value_heads": 16}, "gemma2": {"num_key_value_heads": 4},
    "gemma3_text": {"num_key_value_heads": 4}, "vaultgemma": {"num_key_value_heads": 4},
    "youtu": {"tie_word_embeddings": True}, "minicpm3": {"tie_word_embeddings": True},
    "granitemoe_swa": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "max_position_embeddings": 2048, "sliding_window": 128},
    "granite_swa": {"vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 8192, "num_hidden_layers": 24,
                    "num_attention_heads": 20, "num_key_value_heads": 4, "max_position_embeddings": 8192,
                    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "sliding_window": 128},
    "hyperclovax": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "max_position_embeddings": 2048, "attention_multiplier": None},
    "jais2": {"vocab_size": 150272, "hidden_size": 3328, "intermediate_size": 26624, "num_hidden_layers": 32,
              "num_attention_heads": 26, "max_position_embeddings": 8192, "attention_bias": True, "mlp_bias": True},
    "apertus": {"vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "pad_token_id": 3,
                "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
    "starcoder2": {"num_key_value_heads": 2}, "cohere": {"rope_theta": 500000.0}, "cohere2": {"sliding_window": 4096},
    "phi3": {"rms_norm_eps": 1e-5, "pad_token_id": 32000},
    "smollm3": {"num_key_value_heads": 4, "rope_theta": 2e6, "pad_token_id": 128004, "tie_word_embeddings": True},
    "glm": {"num_key_value_heads": 2, "rms_norm_eps": 1.5625e-07, "pad_token_id": 151329},
    "glm4": {"num_key_value_heads": 2, "rms_norm_eps": 1.5625e-07, "pad_token_id": 151329},
    "seed_oss": {"num_key_value_heads": 8, "attention_bias": True, "pad_token_id": 1},
    "helium": {"num_key_value_heads": 20, "rms_norm_eps": 1e-8, "rope_theta": 100000.0, "pad_token_id": 3},
    "arcee": {"rms_norm_eps": 1e-5},
    "qwen3_vl_text": {"rope_theta": 500000.0},
    "qwen2_vl_text": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_window_layers": 80},
    "qwen2_5_vl_text": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_window_layers": 80},
    "ernie4_5_moe": {"vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 28,
                     "num_attention_heads": 20, "num_key_value_heads": 4, "max_position_embeddings": 131072,
                     "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "pad_token_id": 0, "tie_word_embeddings": True},
    "minimax_m2": {"num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "max_position_embeddings": 196608,
                   "rope_theta": 5e6, "intermediate_size": 1536},
    "mistral4": {"pad_token_id": 11, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0, "original_max_position_embeddings": 8192,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}},
    "ministral3": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 262144,
                   "pad_token_id": 11, "rope_parameters": {
                       "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                       "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                       "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}},
    "exaone4": {"num_key_value_heads": 32, "rms_norm_eps": 1e-5, "sliding_window": 4096},
    "ernie4_5": {"num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "pad_token_id": 0,
                 "tie_word_embeddings": True},
    "glm4_moe": {"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
                 "num_attention_heads": 96, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                 "rms_norm_eps": 1e-5, "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
                 "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                 "first_k_dense_replace": 1},
    "gpt_oss": {"num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
                "sliding_window": 128, "attention_bias": True, "intermediate_size": 2880},
    "internlm3": {"num_key_value_heads": 2, "rms_norm_eps": 1e-5, "pad_token_id": 2},
    "iquestcoder": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5},
    "ministral": {"num_key_value_heads": 8, "sliding_window": 4096},
    "cwm": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "sliding_window": 8192, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 1e6, "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192}},
    "exaone": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "pad_token_id": 0},
    "dots1": {"vocab_size": 152064, "hidden_size": 4608, "intermediate_size": 10944, "moe_intermediate_size": 1408,
              "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": None,
              "n_routed_experts": None, "n_group": 1, "topk_group": 1, "num_experts_per_tok": None,
              "first_k_dense_replace": 0, "norm_topk_prob": False, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-6, "routed_scaling_factor": 1.0, "sliding_window": 4096, "max_window_layers": 62},
    "hunyuan_v1_dense": {"rms_norm_eps": 1e-5, "pad_token_id": 0},
    "flex_olmo": {"vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                  "pad_token_id": 100277, "rope_theta": 500000.0, "num_experts": 7, "num_experts_per_tok": 5},
    "exaone_moe": {"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 2048,
                   "rms_norm_eps": 1e-5, "pad_token_id": 0, "sliding_window": 4096, "first_k_dense_replace": 1,
                   "moe_intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1,
                   "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1},
    "hunyuan_v1_moe": {"rms_norm_eps": 1e-5, "pad_token_id": 0},
    "solar_open": {"vocab_size": 196608, "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 64,
                   "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                   "rope_theta": 1e6, "moe_intermediate_size": 1280, "num_experts_per_tok": 8, "n_shared_experts": 1,
                   "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1},
}
# other names a config.json may give a field (transformers' attribute_map): model_type -> {alias: field}; the alias
# wins where both are set, as in transformers
FIELD_ALIASES = {"internlm3": {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
                 "hunyuan_v1_moe": {"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"},
                 "flex_olmo": {"num_local_experts": "num_experts"},
                 "gptj": {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer",
                          "max_position_embeddings": "n_positions"},
                 "falcon": {"n_embed": "hidden_size"},
                 "bloom": {"n_embed": "hidden_size", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
                 "exaone_moe": {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts"},
                 "exaone": {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                            "activation_function": "hidden_act"}}
# multimodal model types whose language model sailor trains and exports (as a checkpoint of the text model type):
# model_type -> (the text model types its text_config may name, the first when it names none; transformers' text
# config when the config has none)
MULTIMODAL = {
    "gemma3": (("gemma3_text",), {}), "qwen3_5": (("qwen3_5_text",), {}), "qwen3_5_moe": (("qwen3_5_moe_text",), {}),
    "llama4": (("llama4_text",), {}), "qwen3_vl": (("qwen3_vl_text",), {}),
    "qwen2_vl": (("qwen2_vl_text",), None), "qwen2_5_vl": (("qwen2_5_vl_text",), None),
    "mistral3": (("mistral", "ministral3", "mistral4"), {  # Mistral Small 3.1's language model
        "head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 1e9, "sliding_window": None, "vocab_size": 131072}),
}
# text model types of multimodal checkpoints that are another type's causal language model: read and exported as
# that type (their multimodal rotary sections, mrope_section, turn text positions as 1-D rotary positions do), with
# fields that differ fixed (Qwen3-VL's attention has no window, whatever its config says)
TEXT_ALIASES = {"qwen3_vl_text": ("qwen3", {"use_sliding_window": False, "layer_types": None}),
                "qwen2_vl_text": ("qwen2", {}), "qwen2_5_vl_text": ("qwen2", {})}
_ARCHITECTURES = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                  "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "ministral3": "Ministral3ForCausalLM", "llama4_text": "Llama4ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "granite": "GraniteForCausalLM", "phi3": "Phi3ForCausalLM",
                  "starcoder2": "Starcoder2ForCausalLM", "gpt_neox": "GPTNeoXForCausalLM", "opt": "OPTForCausalLM",
                  "gpt2": "GPT2LMHeadModel", "gpt_bigcode": "GPTBigCodeForCausalLM", "gpt_neo": "GPTNeoForCausalLM",
                  "cohere": "CohereForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                  "olmoe": "OlmoeForCausalLM",
                  "qwen2_moe": "Qwen2MoeForCausalLM",
                  "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                  "ernie4_5": "Ernie4_5ForCausalLM", "cohere2": "Cohere2ForCausalLM",
                  "glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM", "exaone4": "Exaone4ForCausalLM",
                  "seed_oss": "SeedOssForCausalLM", "helium": "HeliumForCausalLM",
                  "internlm3": "LlamaForCausalLM", "iquestcoder": "LlamaForCausalLM", "exaone": "LlamaForCausalLM",
                  "ministral": "MinistralForCausalLM", "cwm": "CwmForCausalLM", "solar_open": "SolarOpenForCausalLM",
                  "dots1": "Dots1ForCausalLM", "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
                  "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM", "flex_olmo": "FlexOlmoForCausalLM",
                  "exaone_moe": "ExaoneMoeForCausalLM", "vaultgemma": "VaultGemmaForCausalLM",
                  "youtu": "YoutuForCausalLM", "minicpm3": "MiniCPM3ForCausalLM", "stablelm": "StableLmForCausalLM",
                  "gptj": "GPTJForCausalLM", "olmo": "OlmoForCausalLM", "nemotron": "NemotronForCausalLM",
                  "jais2": "Jais2ForCausalLM", "hyperclovax": "HyperCLOVAXForCausalLM",
                  "granite_swa": "GraniteSWAForCausalLM", "granitemoe_swa": "GraniteMoeSWAForCausalLM",
                  "nanochat": "NanoChatForCausalLM", "falcon": "FalconForCausalLM", "bloom": "BloomForCausalLM",
                  "apertus": "ApertusForCausalLM",
                  "arcee": "ArceeForCausalLM", "gpt_oss": "GptOssForCausalLM", "granitemoe": "GraniteMoeForCausalLM",
                  "granitemoeshared": "GraniteMoeSharedForCausalLM", "phi": "PhiForCausalLM",
                  "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                  "mistral4": "Mistral4ForCausalLM", "minimax_m2": "MiniMaxM2ForCausalLM",
                  "ernie4_5_moe": "Ernie4_5_MoeForCausalLM", "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
                  "glm4_moe": "Glm4MoeForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
                  "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}
