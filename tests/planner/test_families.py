"""Hugging Face configs read per family: parameter counts, sequence length, bad configs.

The parameter counts are the published sizes of each model (transformers'
models of these configs, counted on the meta device, give the same numbers:
checked live below where transformers is installed).
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from planner.errors import SailorError
from planner.specs.families import hf_types
from planner.specs.model import get_model

# The architecture fields of each model's published config.json, and its published size.
PUBLISHED = {
    "opt-125m": ({"model_type": "opt", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 768,
                  "do_layer_norm_before": True, "activation_function": "relu", "pad_token_id": 1}, 125_239_296),
    "opt-350m": ({"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                  "ffn_dim": 4096, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
                  "do_layer_norm_before": False, "activation_function": "relu", "pad_token_id": 1}, 331_196_416),
    "gpt2": ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
              "n_positions": 1024, "activation_function": "gelu_new"}, 124_439_808),
    "gpt-neo-2.7B": ({"model_type": "gpt_neo", "hidden_size": 2560, "num_layers": 32, "num_heads": 20,
                      "vocab_size": 50257, "max_position_embeddings": 2048, "window_size": 256,
                      "attention_types": [[["global", "local"], 16]]}, 2_651_307_520),
    "Llama-3-8B": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                    "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                    "tie_word_embeddings": False}, 8_030_261_248),
    "Mistral-7B": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                    "max_position_embeddings": 32768, "sliding_window": 4096, "tie_word_embeddings": False},
                   7_241_732_096),
    "Qwen2-0.5B": ({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                    "max_position_embeddings": 131072, "rope_theta": 1000000.0, "tie_word_embeddings": True},
                   494_032_768),
    # published as 0.6 B, 0.44 B of them outside the embedding
    "Qwen3-0.6B": ({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                    "tie_word_embeddings": True}, 596_049_920),
    "Phi-3-mini-4k": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                       "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
                       "sliding_window": 2047, "rope_theta": 10000.0, "rope_scaling": None,
                       "tie_word_embeddings": False, "pad_token_id": 32000}, 3_821_079_552),
    # LongRoPE (the factor values stand in for the published ones: they do not change the size)
    "Phi-3.5-mini": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                      "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                      "sliding_window": 262144, "rope_theta": 10000.0, "tie_word_embeddings": False,
                      "pad_token_id": 32000, "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48,
                                                              "long_factor": [2.0] * 48}}, 3_821_079_552),
    "phi-4": ({"model_type": "phi3", "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
               "num_attention_heads": 40, "num_key_value_heads": 10, "vocab_size": 100352,
               "max_position_embeddings": 16384, "original_max_position_embeddings": 16384, "rope_theta": 250000,
               "rope_scaling": None, "sliding_window": None, "tie_word_embeddings": False, "pad_token_id": 100349},
              14_659_507_200),
    "pythia-160m": ({"model_type": "gpt_neox", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                     "intermediate_size": 3072, "vocab_size": 50304, "max_position_embeddings": 2048,
                     "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
                     "tie_word_embeddings": False, "layer_norm_eps": 1e-5, "hidden_act": "gelu"}, 162_322_944),
    "pythia-1.4b": ({"model_type": "gpt_neox", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
                     "intermediate_size": 8192, "vocab_size": 50304, "max_position_embeddings": 2048,
                     "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
                     "tie_word_embeddings": False, "layer_norm_eps": 1e-5, "hidden_act": "gelu"}, 1_414_647_808),
    "starcoder2-3b": ({"model_type": "starcoder2", "hidden_size": 3072, "intermediate_size": 12288,
                       "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
                       "vocab_size": 49152,
                       "max_position_embeddings": 16384, "sliding_window": 4096, "rope_theta": 999999.4420358813,
                       "norm_epsilon": 1e-5, "use_bias": True, "hidden_act": "gelu_pytorch_tanh"}, 3_030_371_328),
    "starcoder2-15b": ({"model_type": "starcoder2", "hidden_size": 6144, "intermediate_size": 24576,
                        "num_hidden_layers": 40, "num_attention_heads": 48, "num_key_value_heads": 4,
                        "vocab_size": 49152, "max_position_embeddings": 16384, "sliding_window": 4096,
                        "rope_theta": 100000, "norm_epsilon": 1e-5, "use_bias": True,
                        "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": False}, 15_957_889_024),
    "gemma-2b": ({"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
                  "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000,
                  "max_position_embeddings": 8192, "hidden_act": "gelu", "rms_norm_eps": 1e-6,
                  "rope_theta": 10000.0}, 2_506_172_416),
    "gemma-7b": ({"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 256000,
                  "max_position_embeddings": 8192, "hidden_act": "gelu", "rms_norm_eps": 1e-6,
                  "rope_theta": 10000.0}, 8_537_680_896),
    "gemma-2-2b": ({"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
                    "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
                    "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                    "final_logit_softcapping": 30.0}, 2_614_341_888),
    "gemma-2-27b": ({"model_type": "gemma2", "hidden_size": 4608, "intermediate_size": 36864, "num_hidden_layers": 46,
                     "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "vocab_size": 256000,
                     "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
                     "query_pre_attn_scalar": 144, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                     "final_logit_softcapping": 30.0}, 27_227_128_320),
    "gemma-3-1b": ({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                    "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                    "vocab_size": 262144, "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh",
                    "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
                    "rope_theta": 1000000, "rope_local_base_freq": 10000, "rope_scaling": None,
                    "attn_logit_softcapping": None, "final_logit_softcapping": None}, 999_885_952),
    # mixtures of experts: 46.7 B and 30.5 B parameters as their model cards give them, exactly as transformers counts
    "Mixtral-8x7B": ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                      "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
                      "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None, "router_aux_loss_coef": 0.02,
                      "output_router_logits": False, "tie_word_embeddings": False}, 46_702_792_704),
    "Qwen3-30B-A3B": ({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                       "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                       "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                       "max_position_embeddings": 40960,
                       "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "rms_norm_eps": 1e-6,
                       "rope_theta": 1e6, "use_sliding_window": False, "sliding_window": None, "decoder_sparse_step": 1,
                       "mlp_only_layers": [], "tie_word_embeddings": False}, 30_532_122_624),
}
# Granite-3.0-3B-A800M: 3.3 B as its model card rounds it; 40 experts, 8 per token, Granite's multipliers
PUBLISHED["granite-3.0-3b-a800m"] = ({"model_type": "granitemoe", "hidden_size": 1536, "intermediate_size": 512,
                                      "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
                                      "vocab_size": 49155, "max_position_embeddings": 4096, "num_local_experts": 40,
                                      "num_experts_per_tok": 8, "embedding_multiplier": 12.0,
                                      "attention_multiplier": 0.015625, "residual_multiplier": 0.22,
                                      "logits_scaling": 6.0, "tie_word_embeddings": True, "rope_theta": 10000.0,
                                      "rms_norm_eps": 1e-6}, 3_298_793_472)
# phi-2: 2.7 B as its model card gives it; attention and MLP side by side, 40 % of each head rotated, a bias on the
# output layer
PUBLISHED["phi-2"] = ({"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 51200,
                       "max_position_embeddings": 2048, "partial_rotary_factor": 0.4, "rope_theta": 10000.0,
                       "layer_norm_eps": 1e-5, "hidden_act": "gelu_new", "tie_word_embeddings": False},
                      2_779_683_840)
# Command R+: 104 B as its model card rounds it; q and k normalised per head, each head with a weight of its own
PUBLISHED["c4ai-command-r-plus"] = ({"model_type": "cohere", "hidden_size": 12288, "intermediate_size": 33792,
                                     "num_hidden_layers": 64, "num_attention_heads": 96, "num_key_value_heads": 8,
                                     "vocab_size": 256000, "max_position_embeddings": 131072, "use_qk_norm": True,
                                     "logit_scale": 0.8333333333333334, "rope_theta": 75000000.0,
                                     "layer_norm_eps": 1e-5, "tie_word_embeddings": True}, 103_810_674_688)
# gpt-oss: 20.91 B and 116.83 B parameters as OpenAI's model card gives them (its experts' weights published in MXFP4)
_GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "num_experts_per_tok": 4, "vocab_size": 201088,
            "max_position_embeddings": 131072, "sliding_window": 128, "swiglu_limit": 7.0, "rope_theta": 150000,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "original_max_position_embeddings": 4096, "truncate": False},
            "attention_bias": True, "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "pad_token_id": 199999}
PUBLISHED["gpt-oss-20b"] = ({**_GPT_OSS, "num_hidden_layers": 24, "num_local_experts": 32,
                             "layer_types": ["sliding_attention", "full_attention"] * 12}, 20_914_757_184)
PUBLISHED["gpt-oss-120b"] = ({**_GPT_OSS, "num_hidden_layers": 36, "num_local_experts": 128,
                              "layer_types": ["sliding_attention", "full_attention"] * 18}, 116_829_156_672)
# DeepSeek-V3: 671 B parameters, 37 B of them active, as its model card gives them (its multi-token prediction
# module, 14 B more in the checkpoint, is not part of transformers' model, nor ours); published in FP8
# (quantization_config left out here). Moonlight-16B-A3B: the same architecture without a q latent
_DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
                "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
                "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid",
                "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
                "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                 "original_max_position_embeddings": 4096, "type": "yarn"},
                "tie_word_embeddings": False, "vocab_size": 129280, "num_nextn_predict_layers": 1}
PUBLISHED["DeepSeek-V3"] = (_DEEPSEEK_V3, 671_026_419_200)
PUBLISHED["Moonlight-16B-A3B"] = ({**_DEEPSEEK_V3, "hidden_size": 2048, "intermediate_size": 11264,
                                   "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
                                   "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
                                   "routed_scaling_factor": 2.446, "q_lora_rank": None, "n_group": 1, "topk_group": 1,
                                   "num_experts_per_tok": 6, "first_k_dense_replace": 1,
                                   "max_position_embeddings": 8192,
                                   "rms_norm_eps": 1e-05, "rope_theta": 50000.0, "rope_scaling": None,
                                   "vocab_size": 163840}, 15_960_108_544 + 26 * 64)
# Kimi K2: DeepSeek-V3's architecture with 384 experts in one group and 64 heads; 1 T parameters, 32 B active
PUBLISHED["Kimi-K2"] = ({**_DEEPSEEK_V3, "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384,
                         "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.827,
                         "vocab_size": 163840, "max_position_embeddings": 131072, "rope_theta": 50000.0,
                         "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                                          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                          "type": "yarn"}, "num_nextn_predict_layers": 0}, 1_026_408_232_448)
# DeepSeek-V2 (236 B, 21 B active) and V2-Lite (15.7 B, 2.4 B active), as their model cards give them: a softmax
# router, group-limited (V2) or greedy (Lite), unrenormalised and scaled weights
_DEEPSEEK_V2 = {"model_type": "deepseek_v2", "hidden_size": 5120, "intermediate_size": 12288,
                "moe_intermediate_size": 1536, "num_hidden_layers": 60, "num_attention_heads": 128,
                "num_key_value_heads": 128, "n_shared_experts": 2, "n_routed_experts": 160,
                "routed_scaling_factor": 16.0, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "group_limited_greedy", "n_group": 8,
                "topk_group": 3, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "norm_topk_prob": False,
                "scoring_func": "softmax", "aux_loss_alpha": 0.003, "seq_aux": True, "hidden_act": "silu",
                "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
                "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                 "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
                "tie_word_embeddings": False, "vocab_size": 102400, "moe_layer_freq": 1}
PUBLISHED["DeepSeek-V2"] = (_DEEPSEEK_V2, 235_741_434_880)
PUBLISHED["DeepSeek-V2-Lite"] = ({**_DEEPSEEK_V2, "hidden_size": 2048, "intermediate_size": 10944,
                                  "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
                                  "num_key_value_heads": 16, "n_routed_experts": 64, "routed_scaling_factor": 1.0,
                                  "q_lora_rank": None, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                                  "aux_loss_alpha": 0.001}, 15_706_484_224)

# GLM-4.5-Air (106 B, 12 B active) and GLM-4.5 (355 B with its multi-token prediction layer, 32 B active): GQA
# with q/k/v biases, half of each head rotated, DeepSeek-V3's experts
_GLM45_AIR = {"model_type": "glm4_moe", "attention_bias": True, "pad_token_id": 151329, "head_dim": 128,
              "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5, "intermediate_size": 10944,
              "max_position_embeddings": 131072, "moe_intermediate_size": 1408, "norm_topk_prob": True,
              "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
              "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
              "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
              "rope_scaling": None, "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
              "use_qk_norm": False, "vocab_size": 151552}
PUBLISHED["GLM-4.5-Air"] = (_GLM45_AIR, 106_852_251_264)
PUBLISHED["GLM-4.5"] = ({**_GLM45_AIR, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                         "num_hidden_layers": 92, "n_routed_experts": 160, "first_k_dense_replace": 3,
                         "routed_scaling_factor": 2.5, "use_qk_norm": True}, 352_797_829_024)

# Qwen3.5-27B's language model: 48 Gated DeltaNet blocks and 16 of gated attention (every fourth); the card's 27 B
# counts its vision encoder too (transformers: 27,349,649,136 with it)
_QWEN3_5_27B = {"model_type": "qwen3_5_text", "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
                "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                "linear_num_value_heads": 48, "full_attention_interval": 4, "vocab_size": 248320,
                "max_position_embeddings": 262144, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
                "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                                    "rope_theta": 10000000, "partial_rotary_factor": 0.25}}
PUBLISHED["Qwen3.5-27B"] = (_QWEN3_5_27B, 26_895_998_464)
# the language models of Gemma 3 27B and Mistral Small 3.1 (24B with its vision encoder), as transformers counts them
_GEMMA3_27B = {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
               "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168,
               "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024, "vocab_size": 262208,
               "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0}
PUBLISHED["gemma-3-27b"] = (_GEMMA3_27B, 27_009_346_304)
_MISTRAL_SMALL_3_1 = {"model_type": "mistral", "head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768,
                      "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 40,
                      "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1e9, "sliding_window": None,
                      "vocab_size": 131072}
PUBLISHED["Mistral-Small-3.1-24B"] = (_MISTRAL_SMALL_3_1, 23_572_403_200)
# Ministral 3 8B's language model (transformers' Ministral3Config defaults, documented as Ministral-3-8B-Base-2512's:
# YaRN from 16k to 256k, q scaled beyond 16k), as transformers counts it
_MINISTRAL_3_8B = {"model_type": "ministral3", "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 34, "num_attention_heads": 32, "vocab_size": 131072}
PUBLISHED["Ministral-3-8B"] = (_MINISTRAL_3_8B, 8_489_553_920)
# Llama 4's language models, as transformers counts them: Scout (16 experts on every block; transformers'
# Llama4TextConfig defaults, documented as Llama-4-Scout-17B-16E's) and Maverick (128 experts on every other block)
_LLAMA4_SCOUT = {"model_type": "llama4_text", "rope_scaling": {
    "rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
    "original_max_position_embeddings": 8192}}
PUBLISHED["Llama-4-Scout-17B-16E"] = (_LLAMA4_SCOUT, 107_769_861_120)
_LLAMA4_MAVERICK = {"model_type": "llama4_text", "num_local_experts": 128, "interleave_moe_layer_step": 2,
                    "use_qk_norm": False, "max_position_embeddings": 1048576}
PUBLISHED["Llama-4-Maverick-17B-128E"] = (_LLAMA4_MAVERICK, 400_711_848_960)
# Mistral Small 4's language model (transformers' Mistral4Config defaults, documented as Mistral-Small-4-119B-2603's)
_MISTRAL_SMALL_4 = {"model_type": "mistral4"}
PUBLISHED["Mistral-Small-4-119B"] = (_MISTRAL_SMALL_4, 118_972_826_624)
# MiniMax-M2: 256 experts, 8 per token, in each of 62 blocks; transformers' count with the score biases (buffers)
_MINIMAX_M2 = {"model_type": "minimax_m2", "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62,
               "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "rotary_dim": 64,
               "num_local_experts": 256, "num_experts_per_tok": 8, "vocab_size": 200064,
               "max_position_embeddings": 196608, "rope_theta": 5000000}
PUBLISHED["MiniMax-M2"] = (_MINIMAX_M2, 228_689_764_864)
# ERNIE-4.5-21B-A3B (transformers' Ernie4_5_MoeConfig defaults, documented as that checkpoint's): 21.8 B
_ERNIE_MOE = {"model_type": "ernie4_5_moe"}
PUBLISHED["ERNIE-4.5-21B-A3B"] = (_ERNIE_MOE, 21_825_437_888)
# GLM-4.7-Flash's architecture at transformers' Glm4MoeLiteConfig defaults: 29.9 B, with the score biases (buffers)
_GLM_LITE = {"model_type": "glm4_moe_lite"}
PUBLISHED["glm4_moe_lite"] = (_GLM_LITE, 29_943_393_920)
# Qwen3.5-35B-A3B's language model (transformers' Qwen3_5MoeTextConfig defaults, which it documents as that
# checkpoint's): 256 experts, 8 per token, a gated shared expert in each of 40 blocks, 30 of them Gated DeltaNet
PUBLISHED["Qwen3.5-35B-A3B"] = ({"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
                                 "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                                 "linear_num_value_heads": 32, "moe_intermediate_size": 512,
                                 "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8,
                                 "num_experts": 256, "vocab_size": 248320}, 34_660_610_688)
# Qwen3-Next-80B-A3B (transformers' Qwen3NextConfig defaults, documented as that checkpoint's): 512 experts, 10 per
# token
# LLaMA's blocks under other model types: InternLM3-8B (dynamic NTK scaling; biases named qkv_bias and bias),
# EXAONE-3.5-7.8B (LLaMA's fields under names of its own), IQuest-Coder-V1-40B and Meta's CWM (transformers' config
# defaults, documented as those checkpoints'; CWM windows three blocks in four), Ministral-8B's shapes (8.02 B; the
# layer_types are ours)
PUBLISHED["internlm3-8b"] = ({"model_type": "internlm3", "bias": False, "qkv_bias": False, "head_dim": 128,
                              "hidden_size": 4096, "intermediate_size": 10240, "max_position_embeddings": 32768,
                              "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 2,
                              "rope_scaling": {"factor": 6.0, "rope_type": "dynamic"}, "rope_theta": 50000000,
                              "vocab_size": 128512}, 8_804_241_408)
PUBLISHED["EXAONE-3.5-7.8B"] = ({"model_type": "exaone", "activation_function": "silu", "hidden_size": 4096,
                                 "intermediate_size": 14336, "layer_norm_epsilon": 1e-05,
                                 "max_position_embeddings": 32768, "num_attention_heads": 32, "num_key_value_heads": 8,
                                 "num_layers": 32, "rope_scaling": {
                                     "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                                 "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 102400},
                                7_818_448_896)
PUBLISHED["IQuest-Coder-V1-40B"] = ({"model_type": "iquestcoder", "hidden_size": 5120, "intermediate_size": 27648,
                                     "num_hidden_layers": 80, "num_attention_heads": 40, "vocab_size": 76800,
                                     "max_position_embeddings": 131072}, 39_794_283_520)
PUBLISHED["cwm"] = ({"model_type": "cwm", "hidden_size": 6144, "intermediate_size": 21504, "num_hidden_layers": 64,
                     "num_attention_heads": 48, "vocab_size": 128256, "max_position_embeddings": 131072},
                    32_581_097_472)
PUBLISHED["Ministral-8B"] = ({"model_type": "ministral", "head_dim": 128, "hidden_size": 4096,
                              "intermediate_size": 12288, "max_position_embeddings": 32768, "num_attention_heads": 32,
                              "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                              "rope_theta": 100000000.0, "sliding_window": 32768, "vocab_size": 131072,
                              "layer_types": ["full_attention", *["sliding_attention"] * 3] * 9}, 8_019_808_256)
# Solar Open 100B (transformers' SolarOpenConfig defaults, documented as Solar-Open-100B's): 102.6 B, experts on
# every block
PUBLISHED["Solar-Open-100B"] = ({"model_type": "solar_open"}, 102_651_799_552)
# dots.llm1 (142 B, 14 B active): GLM-4.5's experts (6 of 128, 2 shared) under Qwen3's attention
PUBLISHED["dots.llm1"] = ({"model_type": "dots1", "attention_bias": False, "first_k_dense_replace": 1,
                           "hidden_size": 4096, "intermediate_size": 10944, "max_position_embeddings": 32768,
                           "max_window_layers": 62, "moe_intermediate_size": 1408, "n_routed_experts": 128,
                           "n_shared_experts": 2, "norm_topk_prob": True, "num_attention_heads": 32,
                           "num_experts_per_tok": 6, "num_hidden_layers": 62, "num_key_value_heads": 32,
                           "rms_norm_eps": 1e-05, "rope_theta": 10000000, "routed_scaling_factor": 2.5,
                           "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 152064},
                          142_774_381_696)
# Hunyuan-7B (7.5 B) and Hunyuan-A13B (80 B, 13 B active: 8 of 64 experts and a shared MLP in each block, its
# top-k given per block): q/k norms after the rotary positions, the base stretched by NTK alpha
_HUNYUAN_7B = {"model_type": "hunyuan_v1_dense", "attention_bias": False, "head_dim": 128, "hidden_size": 4096,
               "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": {
                   "alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "type": "dynamic"}, "rope_theta": 10000.0, "tie_word_embeddings": True,
               "vocab_size": 128167}
PUBLISHED["Hunyuan-7B"] = (_HUNYUAN_7B, 7_504_568_320)
PUBLISHED["Hunyuan-A13B"] = ({**_HUNYUAN_7B, "model_type": "hunyuan_v1_moe", "intermediate_size": 3072,
                              "num_experts": 64, "moe_topk": [8] * 32}, 80_393_183_232)
# FlexOlmo-7x7B (transformers' FlexOlmoConfig defaults, documented as that checkpoint's): 33.3 B, OLMo 2's blocks
# with 7 experts, 5 per token; K-EXAONE's architecture at transformers' ExaoneMoeConfig defaults (its docs name
# K-EXAONE-236B-A23B, whose config differs): EXAONE 4's attention, DeepSeek-V3's experts, a dense first block
PUBLISHED["FlexOlmo-7x7B"] = ({"model_type": "flex_olmo"}, 33_270_665_216)
PUBLISHED["exaone_moe"] = ({"model_type": "exaone_moe"}, 28_550_641_600)
# Youtu-LLM-2B (transformers' YoutuConfig defaults, documented as that checkpoint's): DeepSeek-V3's latent attention,
# a dense MLP in every block, tied
PUBLISHED["Youtu-LLM-2B"] = ({"model_type": "youtu"}, 1_961_560_064)
# StableLM 2 1.6B (q/k/v biases) and StableLM-3B-4E1T: LayerNorms with biases, a quarter of each head rotated
_STABLELM_2 = {"model_type": "stablelm", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
               "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352,
               "max_position_embeddings": 4096, "layer_norm_eps": 1e-5, "partial_rotary_factor": 0.25,
               "rope_theta": 10000, "use_qkv_bias": True, "use_parallel_residual": False, "qk_layernorm": False,
               "tie_word_embeddings": False}
PUBLISHED["stablelm-2-1_6b"] = (_STABLELM_2, 1_644_515_328)
PUBLISHED["stablelm-3b-4e1t"] = ({"model_type": "stablelm", "hidden_size": 2560, "intermediate_size": 6912,
                                  "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 50304,
                                  "max_position_embeddings": 4096}, 2_795_443_200)
# StableLM 2 12B: attention and MLP side by side on one LayerNorm, a LayerNorm for each head's q and k: 12.1 B
PUBLISHED["stablelm-2-12b"] = ({**_STABLELM_2, "hidden_size": 5120, "intermediate_size": 13824,
                                "num_hidden_layers": 40, "num_key_value_heads": 8, "use_qkv_bias": False,
                                "use_parallel_residual": True, "qk_layernorm": True}, 12_143_185_920)
# GPT-J-6B: 6.05 B as transformers counts it (the output layer's bias included)
PUBLISHED["gpt-j-6b"] = ({"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16, "n_positions": 2048,
                          "rotary_dim": 64, "vocab_size": 50400, "activation_function": "gelu_new",
                          "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False}, 6_050_882_784)
# Jais 2 at transformers' Jais2Config defaults, documented as Jais-2-8B-Chat's: 8.09 B
PUBLISHED["jais2"] = ({"model_type": "jais2"}, 8_090_401_280)
# HyperCLOVA X at transformers' HyperCLOVAXConfig defaults (LLaMA-7B's shape with Peri-LN's output norms)
PUBLISHED["hyperclovax"] = ({"model_type": "hyperclovax"}, 6_738_677_760)
# Granite SWA at transformers' GraniteSWAConfig defaults (every fourth block full, the others windowed; sinks)
PUBLISHED["granite_swa"] = ({"model_type": "granite_swa"}, 2_144_463_840)
PUBLISHED["granitemoe_swa"] = ({"model_type": "granitemoe_swa"}, 37_039_117_312)  # (8 experts, 2 per token)
# MiniCPM3-4B (transformers' MiniCPM3Config defaults, documented as its): DeepSeek-V2's latent attention with a dense
# MLP, tied: 4.07 B
PUBLISHED["MiniCPM3-4B"] = ({"model_type": "minicpm3"}, 4_073_875_968)
# nanochat d32 (depth 32, 64 dimensions per layer of depth, heads of 128, MLP 4 x wide; untied): 1.88 B
PUBLISHED["nanochat-d32"] = ({"model_type": "nanochat", "hidden_size": 2048, "intermediate_size": 8192,
                              "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 16,
                              "vocab_size": 65536, "max_position_embeddings": 2048}, 1_879_048_192)
# StarCoder (GPTBigCode: GPT-2 with one key/value head), its card's 15.5 B
PUBLISHED["starcoder"] = ({"model_type": "gpt_bigcode", "n_embd": 6144, "n_layer": 40, "n_head": 48, "n_inner": 24576,
                           "n_positions": 8192, "vocab_size": 49152, "multi_query": True}, 15_517_456_384)
# OLMo-1B and OLMo-7B (OLMo 1: LayerNorms without weights; the 1B tied), their cards' 1.18 B and 6.89 B
_OLMO_1B = {"model_type": "olmo", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 16, "vocab_size": 50304, "max_position_embeddings": 2048,
            "tie_word_embeddings": True}
PUBLISHED["OLMo-1B-hf"] = (_OLMO_1B, 1_176_764_416)
PUBLISHED["OLMo-7B-hf"] = ({**_OLMO_1B, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                            "num_attention_heads": 32, "tie_word_embeddings": False}, 6_888_095_744)
# Minitron-4B's shape (Nemotron: LayerNorm1P with biases, an ungated ReLU-squared MLP, half of each head rotated)
PUBLISHED["Minitron-4B-Base"] = ({"model_type": "nemotron", "hidden_size": 3072, "intermediate_size": 9216,
                                  "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
                                  "head_dim": 128, "vocab_size": 256000, "max_position_embeddings": 4096,
                                  "partial_rotary_factor": 0.5, "norm_eps": 1e-5, "hidden_act": "relu2",
                                  "tie_word_embeddings": False}, 4_190_509_056)
# OPT-125m's shape with LayerNorms without weights or biases (layer_norm_elementwise_affine false)
PUBLISHED["opt-125m-no-norm-weights"] = ({**PUBLISHED["opt-125m"][0], "layer_norm_elementwise_affine": False},
                                         125_239_296 - 2 * 768 * (2 * 12 + 1))
# BLOOM (ALiBi, a LayerNorm on the embeddings): bloom-560m, bloom-7b1 and the 176 B BLOOM, their cards' 559 M, 7.07 B
# and 176 B
_BLOOM = {"model_type": "bloom", "vocab_size": 250880}
PUBLISHED["bloom-560m"] = ({**_BLOOM, "hidden_size": 1024, "n_layer": 24, "n_head": 16}, 559_214_592)
PUBLISHED["bloom-7b1"] = ({**_BLOOM, "hidden_size": 4096, "n_layer": 30, "n_head": 32}, 7_069_016_064)
PUBLISHED["bloom"] = ({**_BLOOM, "hidden_size": 14336, "n_layer": 70, "n_head": 112}, 176_247_271_424)
# Falcon-7B (one key/value head, attention and MLP on one norm, tied) and Falcon-40B (8 query groups, a norm for each
# sublayer)
PUBLISHED["falcon-7b"] = ({"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
                           "num_attention_heads": 71, "vocab_size": 65024, "multi_query": True, "parallel_attn": True,
                           "bias": False, "alibi": False, "new_decoder_architecture": False}, 6_921_720_704)
PUBLISHED["falcon-40b"] = ({"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60,
                            "num_attention_heads": 128, "num_kv_heads": 8, "vocab_size": 65024,
                            "new_decoder_architecture": True, "bias": False, "alibi": False}, 41_303_293_952)
# Apertus's architecture at transformers' ApertusConfig defaults (an ungated xIELU MLP: 2 trained scalars a block)
PUBLISHED["apertus"] = ({"model_type": "apertus"}, 6_979_596_352)
PUBLISHED["Qwen3-Next-80B-A3B"] = ({"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48,
                                    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                                    "linear_num_value_heads": 32, "moe_intermediate_size": 512,
                                    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
                                    "num_experts": 512, "vocab_size": 151936}, 79_674_391_296)


@pytest.mark.parametrize("model_type, text", [("qwen3_5", _QWEN3_5_27B), ("gemma3", _GEMMA3_27B),
                                               ("mistral3", _MISTRAL_SMALL_3_1), ("mistral3", _MINISTRAL_3_8B),
                                               ("llama4", _LLAMA4_SCOUT), ("mistral3", _MISTRAL_SMALL_4)])
def test_multimodal_config_is_its_language_model(model_type, text, tmp_path):
    """Qwen3.5's, Gemma 3's (4B and larger), Mistral Small 3.1's, Ministral 3's, Mistral Small 4's and Llama 4's
    published configs nest the language model in text_config: the same model as that text_config alone (the vision
    tower is not read)."""
    alone = get_model(str(_write(tmp_path, text)))
    wrapped = get_model(str(_write(tmp_path, {"model_type": model_type, "text_config": text,
                                              "vision_config": {"hidden_size": 1152}})))
    assert replace(wrapped, name="", hf_model_type="") == replace(alone, name="", hf_model_type="")
    assert wrapped.hf_model_type == text["model_type"]  # (exported as that text model)
    with pytest.raises(SailorError, match="text_config must be an object"):
        get_model(str(_write(tmp_path, {"model_type": model_type, "text_config": [1]})))
    with pytest.raises(SailorError, match=f"text_config's model_type 'llama' is not supported in a {model_type} "
                                          f"config; use .*{text['model_type']}"):
        get_model(str(_write(tmp_path, {"model_type": model_type, "text_config": {**text, "model_type": "llama"}})))


# Qwen2.5-VL-7B's published config: the language model's fields beside vision_config (no text_config), its
# multimodal rotary sections as rope type mrope
_QWEN2_5_VL_7B = {"model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944,
                  "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                  "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "sliding_window": 32768,
                  "max_window_layers": 28, "use_sliding_window": False, "tie_word_embeddings": False,
                  "vision_config": {"depth": 32, "hidden_size": 1280}}


def test_qwen_vl_configs_are_their_language_models(tmp_path):
    """Qwen2.5-VL's published (flat) config and the one transformers 5 saves from it (text_config) are the same
    Qwen2 language model, 7.6 B as transformers counts it without the vision tower; Qwen3-VL's language model is
    Qwen3's without windows, whatever its config says. Both export as their causal LM's type."""
    transformers = pytest.importorskip("transformers")
    import torch

    flat = get_model(str(_write(tmp_path, _QWEN2_5_VL_7B)))
    (tmp_path / "saved").mkdir()
    config = transformers.AutoConfig.for_model(**_QWEN2_5_VL_7B)
    config.save_pretrained(tmp_path / "saved")
    assert "text_config" in json.loads((tmp_path / "saved" / "config.json").read_text())
    assert replace(get_model(str(tmp_path / "saved")), name="").to_dict() == replace(flat, name="").to_dict()
    with torch.device("meta"):
        live = transformers.AutoModelForImageTextToText.from_config(config)
    language = sum(p.numel() for n, p in live.named_parameters() if not n.startswith("model.visual."))
    assert flat.total_params(padded=False) == language == 7_615_616_512
    assert (flat.hf_model_type, flat.qkv_bias, flat.windows) == ("qwen2", True, ())
    text = {"model_type": "qwen3_vl_text", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
            "max_position_embeddings": 262144, "use_sliding_window": True, "sliding_window": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20],
                                "mrope_interleaved": True}}
    qwen3_vl = get_model(str(_write(tmp_path, {"model_type": "qwen3_vl", "text_config": text})))
    assert (qwen3_vl.hf_model_type, qwen3_vl.qk_norm, qwen3_vl.windows, qwen3_vl.rope_theta) == \
        ("qwen3", True, (), 5e6)


def test_multimodal_details(tmp_path):
    """Qwen3.5-27B: every fourth block full attention. Mistral 3 without text_config is Mistral Small 3.1; the
    head is tied as the outer tie_word_embeddings says, else as text_config's does (transformers 5 ties by the
    outer field, default true, but unties Mistral's published checkpoints, whose lm_head is their own)."""
    qwen = get_model(str(_write(tmp_path, {"model_type": "qwen3_5", "text_config": _QWEN3_5_27B})))
    assert qwen.linear_blocks == tuple(i for i in range(64) if i % 4 != 3)
    assert (qwen.attention_gate, qwen.norm_offset, qwen.rotary_dim) == (True, True, 64)
    small = get_model(str(_write(tmp_path, {"model_type": "mistral3"})))
    assert replace(small, name="") == replace(get_model(str(_write(tmp_path, _MISTRAL_SMALL_3_1))), name="")
    assert not small.tied_embeddings
    for outer, inner, tied in ((None, True, True), (True, False, True), (False, True, False), (None, None, False)):
        cfg = {"model_type": "mistral3", "text_config": {**_MISTRAL_SMALL_3_1, "tie_word_embeddings": inner},
               **({} if outer is None else {"tie_word_embeddings": outer})}
        assert get_model(str(_write(tmp_path, cfg))).tied_embeddings == tied, (outer, inner)
    assert get_model(str(_write(tmp_path, {"model_type": "gemma3", "text_config": _GEMMA3_27B}))).tied_embeddings
    with pytest.raises(SailorError, match="layer_types must list linear_attention or full_attention"):
        get_model(str(_write(tmp_path, {**_QWEN3_5_27B, "layer_types": ["sliding_attention"] * 64})))


def transformers_count(cfg: dict) -> int:
    """Parameters of transformers' model of `cfg`, built on the meta device (skips without transformers), and
    DeepSeek-V3's expert score biases, buffers there, tensors of its checkpoints, and parameters of ours."""
    transformers = pytest.importorskip("transformers")
    import torch

    with torch.device("meta"):
        config = transformers.AutoConfig.for_model(**cfg)  # (5.24's auto classes lack Mistral 4's causal LM)
        live = transformers.Mistral4ForCausalLM(config) if cfg["model_type"] == "mistral4" else \
            transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in live.parameters()) + sum(b.numel() for name, b in live.named_buffers()
                                                            if name.endswith("e_score_correction_bias"))


def _write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_is_the_published_one(name, tmp_path):
    cfg, published = PUBLISHED[name]
    model = get_model(str(_write(tmp_path, cfg)))
    assert model.total_params(padded=False) == published
    assert transformers_count(cfg) == published


@pytest.mark.parametrize("name", ["internlm3-8b", "EXAONE-3.5-7.8B", "IQuest-Coder-V1-40B", "cwm", "Ministral-8B",
                                  "Solar-Open-100B", "dots.llm1", "exaone_moe"])
def test_llama_like_configs_read_as_transformers_reads_them(name, tmp_path):
    """The model types transformers builds from LLaMA's, Qwen3's or GLM-4.5's code with defaults and field names of
    their own (checked live): the head dimension, the norms' epsilon, which blocks are windowed and how wide (the
    default patterns: CWM's every fourth block full, from the first; dots.llm1's windows from max_window_layers on),
    biases, the rotary base, the dense blocks (Solar Open has none)."""
    transformers = pytest.importorskip("transformers")
    cfg = {**PUBLISHED[name][0], **({"sliding_window": 16} if name == "cwm" else
                                    {"sliding_window": 16, "max_window_layers": 60} if name == "dots.llm1" else {})}
    model = get_model(str(_write(tmp_path, cfg)))
    live = transformers.AutoConfig.for_model(**cfg)
    types = getattr(live, "layer_types", None) if live.model_type in ("cwm", "ministral", "dots1", "exaone_moe") \
        else None
    windows = tuple(live.sliding_window if t == "sliding_attention" else 0 for t in types) if types else ()
    head_dim = getattr(live, "head_dim", live.hidden_size // live.num_attention_heads)  # (dots1's has none)
    assert (model.head_dim, model.norm_eps, model.windows, model.rope_theta, model.qkv_bias, model.mlp_bias) == \
        (head_dim, live.rms_norm_eps, windows, live.rope_parameters["rope_theta"],
         getattr(live, "attention_bias", False), getattr(live, "mlp_bias", False))
    assert model.num_blocks == live.num_hidden_layers
    assert model.dense_blocks == tuple(range(getattr(live, "first_k_dense_replace", 0) if model.experts else 0))
    if name == "exaone_moe":  # (the full blocks without rotary positions, EXAONE 4's)
        assert model.nope_blocks == tuple(i for i, t in enumerate(types) if t == "full_attention")
    if name == "cwm":
        assert model.windows[:5] == (0, 16, 16, 16, 0)
    if name == "dots.llm1":
        assert model.windows[58:] == (0, 0, 16, 16) and model.qk_norm and model.experts == 128


def test_llama_like_field_names_and_refusals(tmp_path):
    """InternLM3's qkv_bias and bias, and EXAONE 3's num_layers, layer_norm_epsilon and activation_function, are
    LLaMA's fields by other names (winning where both are set, as in transformers); what transformers refuses for
    these types is refused in one line."""
    internlm3 = get_model(str(_write(tmp_path, {**PUBLISHED["internlm3-8b"][0], "qkv_bias": True, "bias": True,
                                                "attention_bias": False})))
    assert internlm3.qkv_bias and internlm3.out_bias and internlm3.mlp_bias
    assert dict(internlm3.rope_scaling) == {"type": "dynamic", "factor": 6.0}
    # transformers' LLaMA attends to every token, whatever layer_types says: so do we, and export refuses windows
    llama = get_model(str(_write(tmp_path, {**PUBLISHED["Llama-3-8B"][0], "sliding_window": 16,
                                            "layer_types": ["sliding_attention"] * 32})))
    assert llama.windows == ()
    from planner.specs.families import to_hf_config

    with pytest.raises(SailorError, match="llama's blocks attend to every token; its config cannot express "
                                          "attention windows"):
        to_hf_config(replace(llama, windows=(16,) * 32))
    exaone = get_model(str(_write(tmp_path, {**PUBLISHED["EXAONE-3.5-7.8B"][0], "num_hidden_layers": 8,
                                             "layer_norm_epsilon": 1e-3, "activation_function": "gelu_new"})))
    assert (exaone.num_blocks, exaone.norm_eps, exaone.activation, exaone.family) == (32, 1e-3, "gelu_tanh", "exaone")
    for name, change, needle in (
            ("internlm3-8b", {"qkv_bias": True}, "internlm3 puts a bias on every linear or on none; set qkv_bias "
                                                 "and bias alike"),
            ("IQuest-Coder-V1-40B", {"clip_qkv": 8}, "clip_qkv and use_sliding_window are not supported for "
                                                      "iquestcoder"),
            ("IQuest-Coder-V1-40B", {"use_sliding_window": True}, "clip_qkv and use_sliding_window"),
            ("Solar-Open-100B", {"partial_rotary_factor": 0.5}, "solar_open rotates whole heads; remove "
                                                                 "partial_rotary_factor 0.5"),
            ("dots.llm1", {"n_shared_experts": None}, "n_shared_experts must be a whole number >= 0, not null"),
            ("gpt-j-6b", {"rotary_dim": None}, "gptj needs rotary_dim, the dimensions of each head that rotary "
                                               "positions turn; set it"),
            ("gpt-j-6b", {"rotary_dim": 257}, "rotary_dim 257 must be even and at most a head's 256 dimensions"),
            ("EXAONE-3.5-7.8B", {"num_layers": "32"}, "num_hidden_layers must be a positive integer, not '32'")):
        with pytest.raises(SailorError, match=needle):
            get_model(str(_write(tmp_path, {**PUBLISHED[name][0], **change})))


def test_gpt_bigcode_details(tmp_path):
    """StarCoder's one key/value head (which TP cannot split), or a head each without multi_query; both export as
    the same model. Cross-attention is refused in one line."""
    from planner.specs.families import to_hf_config

    starcoder = get_model(str(_write(tmp_path, PUBLISHED["starcoder"][0])))
    assert (starcoder.num_query_groups, starcoder.learned_positions, starcoder.tied_embeddings, starcoder.activation,
            starcoder.tp_degrees(8)) == (1, True, True, "gelu_tanh", [1])
    mha = get_model(str(_write(tmp_path, {**PUBLISHED["starcoder"][0], "multi_query": False})))
    assert mha.num_query_groups == 48 and mha.tp_degrees(8) == [1, 2, 4, 8]
    for model in (starcoder, mha):
        assert get_model(str(_write(tmp_path, to_hf_config(model)))) == model
    with pytest.raises(SailorError, match="key/value heads are neither one nor one per head"):
        to_hf_config(replace(mha, kv_heads=8))
    with pytest.raises(SailorError, match="add_cross_attention .* is not supported for gpt_bigcode"):
        get_model(str(_write(tmp_path, {**PUBLISHED["starcoder"][0], "add_cross_attention": True})))


def test_hyperclovax_details(tmp_path):
    """HyperCLOVA X: Granite's multipliers with a norm on each sublayer's output (use_post_norm), the logits multiplied
    by logits_scaling, the attention scale 1/sqrt(head_dim) unless set (transformers saves that default's value,
    read back as the default); without use_post_norm, Granite's blocks. Each exports as the same model."""
    from planner.specs.families import to_hf_config

    model = get_model(str(_write(tmp_path, {"model_type": "hyperclovax", "logits_scaling": 4,
                                            "residual_multiplier": 0.5, "embedding_multiplier": 3})))
    assert (model.sandwich_norm, model.logits_divisor, model.residual_multiplier, model.embedding_multiplier,
            model.attention_scale, model.rms_norm) == (True, 0.25, 0.5, 3.0, 0.0, True)
    scaled = get_model(str(_write(tmp_path, {"model_type": "hyperclovax", "attention_multiplier": 0.1,
                                             "use_post_norm": False})))
    assert (scaled.attention_scale, scaled.sandwich_norm) == (0.1, False)
    assert get_model(str(_write(tmp_path, {"model_type": "hyperclovax", "attention_multiplier": 128 ** -0.5}))) == \
        replace(model, logits_divisor=1.0, residual_multiplier=1.0, embedding_multiplier=1.0)
    for spec in (model, scaled):
        assert get_model(str(_write(tmp_path, to_hf_config(spec)))) == spec


def test_granite_swa_details(tmp_path):
    """Granite SWA: by default every fourth block full from the first, the others windowed (128), a sink per head on
    every block; layer_rope_theta's zeros are blocks without rotary positions, and its one other base the rotary
    base. GraniteMoE SWA: the same attention with GraniteMoeShared's experts. Several bases are refused in one line;
    each reading exports as the same model."""
    from planner.specs.families import to_hf_config

    model = get_model(str(_write(tmp_path, PUBLISHED["granite_swa"][0])))
    assert model.windows == (0, 128, 128, 128) * 6 and model.attention_sinks and model.nope_blocks == ()
    nope = get_model(str(_write(tmp_path, {"model_type": "granite_swa", "num_hidden_layers": 4, "sliding_window": 64,
                                           "layer_rope_theta": [0, 5e5, 5e5, 0]})))
    assert (nope.nope_blocks, nope.rope_theta, nope.windows) == ((0, 3), 5e5, (0, 64, 64, 64))
    experts = get_model(str(_write(tmp_path, {"model_type": "granitemoe_swa", "num_hidden_layers": 4,
                                              "shared_intermediate_size": 512})))
    assert (experts.experts, experts.experts_per_token, experts.shared_expert_ffn, experts.windows,
            experts.attention_sinks) == (8, 2, 512, (0, 128, 128, 128), True)
    for spec in (model, nope, experts):
        assert get_model(str(_write(tmp_path, to_hf_config(spec)))) == spec
    with pytest.raises(SailorError, match=r"different rotary bases \[10000.0, 500000.0\]"):
        get_model(str(_write(tmp_path, {"model_type": "granite_swa", "num_hidden_layers": 2,
                                        "layer_rope_theta": [1e4, 5e5]})))


def test_minicpm3_details(tmp_path):
    """MiniCPM3: latent attention (halves rotated) with a dense MLP; the embeddings times scale_emb, each residual
    branch times scale_depth / sqrt(blocks), the logits divided by hidden / dim_model_base (null: no scaling); it
    exports as the same model."""
    from planner.specs.families import to_hf_config

    model = get_model(str(_write(tmp_path, PUBLISHED["MiniCPM3-4B"][0])))
    assert (model.latent, model.experts, model.rotary_interleaved, model.v_head_dim, model.embedding_multiplier,
            model.logits_divisor) == (True, 0, False, 64, 12.0, 10.0)
    assert model.residual_multiplier == pytest.approx(1.4 / 62 ** 0.5, rel=1e-15)
    plain = get_model(str(_write(tmp_path, {"model_type": "minicpm3", "scale_depth": None, "dim_model_base": None})))
    assert (plain.residual_multiplier, plain.logits_divisor) == (1.0, 1.0)
    for spec in (model, plain):
        assert get_model(str(_write(tmp_path, to_hf_config(spec)))) == spec
    with pytest.raises(SailorError, match="not hidden_size over a whole dim_model_base"):
        to_hf_config(replace(model, logits_divisor=3.0))


def test_nanochat_details(tmp_path):
    """nanochat: RMSNorms without weights, one on the embeddings too (its input kept for backward), q/k norms,
    rotary positions turned the other way, logits capped at 15; it exports as the same model, and Megatron-LM's
    arguments cannot express it."""
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    model = get_model(str(_write(tmp_path, PUBLISHED["nanochat-d32"][0])))
    assert (model.rms_norm, model.norm_weight, model.embedding_norm, model.qk_l2_norm, model.rotary_reversed,
            model.logit_softcap, model.gated_mlp, model.activation) == (True, False, True, True, True, 15.0, False,
                                                                         "relu2")
    assert model.activation_floats(0) == 2 * 2048 == 2 * replace(model, embedding_norm=False).activation_floats(0)
    assert get_model(str(_write(tmp_path, to_hf_config(model)))) == model
    uncapped = get_model(str(_write(tmp_path, {**PUBLISHED["nanochat-d32"][0], "final_logit_softcapping": None})))
    assert uncapped.logit_softcap == 0 and to_hf_config(uncapped)["final_logit_softcapping"] is None
    with pytest.raises(SailorError, match="stock Megatron-LM's arguments cannot express"):
        megatron_model_args(model)
    with pytest.raises(SailorError, match="norms without weights .* have no bias"):
        replace(model, rms_norm=False)


def test_olmo1_details(tmp_path):
    """OLMo 1's LayerNorms have no weights (nothing to count, load or train) and an epsilon of 1e-5 whatever the
    config says; clip_qkv clamps q, k and v. It exports as the same model; Megatron-LM's arguments cannot express
    either."""
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    model = get_model(str(_write(tmp_path, {**PUBLISHED["OLMo-7B-hf"][0], "clip_qkv": 8, "rms_norm_eps": 0.1})))
    assert (model.norm_weight, model.norm_bias, model.rms_norm, model.norm_eps, model.qkv_clip, model.pad_token) == \
        (False, False, False, 1e-5, 8.0, 1)
    assert model.params(model.num_layers - 1) == model.padded_vocab(1) * 4096  # the head: its final norm holds nothing
    assert get_model(str(_write(tmp_path, to_hf_config(model)))) == model
    with pytest.raises(SailorError, match="cannot be written as an olmo config"):
        to_hf_config(replace(model, norm_eps=1e-6))
    with pytest.raises(SailorError, match="uses norms without weights"):
        megatron_model_args(model)
    with pytest.raises(SailorError, match=r"uses q, k and v clamped to 8 \(clip_qkv\)"):
        megatron_model_args(replace(model, norm_weight=True, norm_bias=True))
    with pytest.raises(SailorError, match="clip_qkv must be a positive number, not 0"):
        get_model(str(_write(tmp_path, {**PUBLISHED["OLMo-7B-hf"][0], "clip_qkv": 0})))
    with pytest.raises(SailorError, match="norms without weights .* have no bias"):
        replace(model, norm_bias=True)


def test_nemotron_details(tmp_path):
    """Nemotron's LayerNorm1P reads as LayerNorms with biases that scale by (1 + w), its MLP as ungated ReLU squared,
    half of each 128-wide head rotated; it exports as the same model. Megatron-LM's arguments cannot express the
    (1 + w) norms (nor the partial rotation). Jais 2 is that block with plain LayerNorms and whole heads rotated."""
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    model = get_model(str(_write(tmp_path, PUBLISHED["Minitron-4B-Base"][0])))
    assert (model.rms_norm, model.norm_bias, model.norm_offset, model.gated_mlp, model.activation,
            model.rotary_dim, model.head_dim, model.num_query_groups) == (False, True, True, False, "relu2", 64, 128, 8)
    assert get_model(str(_write(tmp_path, to_hf_config(model)))) == model
    with pytest.raises(SailorError, match="cannot be written as a nemotron config"):
        to_hf_config(replace(model, gated_mlp=True))
    with pytest.raises(SailorError, match="norms that scale by"):
        megatron_model_args(replace(model, rotary_fraction=1.0))
    jais = get_model(str(_write(tmp_path, PUBLISHED["jais2"][0])))  # the same block with plain LayerNorms
    assert (jais.norm_offset, jais.norm_bias, jais.rotary_fraction, jais.qkv_bias, jais.mlp_bias, jais.head_dim) == \
        (False, True, 1.0, True, True, 128)
    assert get_model(str(_write(tmp_path, to_hf_config(jais)))) == jais
    with pytest.raises(SailorError, match="cannot be written as a jais2 config: its layers differ from Jais 2's"):
        to_hf_config(replace(jais, rotary_fraction=0.5))


def test_stablelm_2_12b_details(tmp_path):
    """StableLM 2 12B's q/k LayerNorms, one per head (its q heads', its key/value heads'), weights of their own split
    over TP with the heads and no bias, beside LayerNorms with biases; it exports as the same model."""
    from planner.specs.families import to_hf_config

    model = get_model(str(_write(tmp_path, PUBLISHED["stablelm-2-12b"][0])))
    assert (model.qk_norm, model.qk_norm_per_head, model.rms_norm, model.norm_bias, model.shared_norm) == \
        (True, True, False, True, True)
    assert get_model(str(_write(tmp_path, to_hf_config(model)))) == model


def test_bloom_details(tmp_path):
    """BLOOM: ALiBi in every block and no rotary positions, a LayerNorm (with its parameters) on the embeddings, a
    4 x wide tanh-GELU MLP, tied; it exports as the same model. Megatron-LM's arguments cannot express ALiBi, and a
    residual taken after the norm is refused in one line."""
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    model = get_model(str(_write(tmp_path, PUBLISHED["bloom-560m"][0])))
    assert (model.alibi, model.rotary(0), model.learned_positions, model.embedding_norm, model.activation,
            model.ffn_hidden, model.tied_embeddings, model.context_length) == (True, False, False, True, "gelu_tanh",
                                                                               4096, True, 2048)
    assert model.params(0) == model.padded_vocab(1) * 1024 + 2 * 1024  # the embedding and its LayerNorm
    assert get_model(str(_write(tmp_path, to_hf_config(model)))) == model
    with pytest.raises(SailorError, match="ALiBi attention biases"):
        megatron_model_args(replace(model, embedding_norm=False))
    with pytest.raises(SailorError, match="apply_residual_connection_post_layernorm .* is not supported for bloom"):
        get_model(str(_write(tmp_path, {**PUBLISHED["bloom-560m"][0],
                                        "apply_residual_connection_post_layernorm": True})))
    with pytest.raises(SailorError, match="ALiBi .* without learned positions"):
        replace(model, learned_positions=True)


def test_falcon_details(tmp_path):
    """Falcon's three block shapes read as transformers builds them: Falcon-7B's single key/value head (TP cannot
    split it) and one norm, Falcon-40B's query groups and a norm for each sublayer (a family of its own for their
    tensor names), the sublayers one after the other without parallel_attn. Each exports as a config that reads back
    as the same model; ALiBi and field combinations transformers cannot build are refused in one line."""
    from planner.specs.families import to_hf_config

    seven = get_model(str(_write(tmp_path, PUBLISHED["falcon-7b"][0])))
    assert (seven.family, seven.num_query_groups, seven.parallel_residual, seven.shared_norm, seven.tied_embeddings,
            seven.qkv_bias, seven.ffn_hidden, seven.activation) == ("falcon", 1, True, True, True, False, 4 * 4544,
                                                                    "gelu")
    assert seven.tp_degrees(8) == [1]
    forty = get_model(str(_write(tmp_path, PUBLISHED["falcon-40b"][0])))
    assert (forty.family, forty.num_query_groups, forty.parallel_residual, forty.shared_norm) == \
        ("falcon-40b", 8, True, False)
    eleven = get_model(str(_write(tmp_path, {**PUBLISHED["falcon-40b"][0], "num_ln_in_parallel_attn": 1})))
    assert (eleven.family, eleven.num_query_groups, eleven.shared_norm) == ("falcon", 8, True)
    sequential = get_model(str(_write(tmp_path, {**PUBLISHED["falcon-7b"][0], "multi_query": False,
                                                 "parallel_attn": False, "bias": True})))
    assert (sequential.num_query_groups, sequential.parallel_residual, sequential.qkv_bias, sequential.mlp_bias) == \
        (71, False, True, True)
    for model in (seven, forty, eleven, sequential):
        assert get_model(str(_write(tmp_path, to_hf_config(model)))) == model
    with pytest.raises(SailorError, match="cannot be written as a falcon config"):
        to_hf_config(replace(forty, parallel_residual=False, shared_norm=False))
    for change, needle in (
            ({"alibi": True}, "falcon with alibi .* is not supported; use a rotary Falcon"),
            ({"num_kv_heads": 8, "multi_query": False}, "num_kv_heads 8 needs new_decoder_architecture"),
            ({"num_ln_in_parallel_attn": 2}, "num_ln_in_parallel_attn 2 needs new_decoder_architecture; set it to 1"),
            ({"new_decoder_architecture": True, "num_ln_in_parallel_attn": 3}, "must be 1 or 2, not 3"),
            ({"activation": "tanh"}, "activation 'tanh' is not supported")):
        with pytest.raises(SailorError, match=needle):
            get_model(str(_write(tmp_path, {**PUBLISHED["falcon-7b"][0], **change})))


def test_apertus_details(tmp_path):
    """Apertus: an ungated MLP with xIELU (or the activation its config names), per-head q/k norms before the rotary
    positions, LLaMA 3.1's scaling by default. xIELU goes in ungated dense MLPs alone; Megatron-LM's arguments
    cannot express it (nor the q/k norms)."""
    from planner.targets.megatron_lm import megatron_model_args

    apertus = get_model(str(_write(tmp_path, PUBLISHED["apertus"][0])))
    assert (apertus.activation, apertus.gated_mlp, apertus.qk_norm, apertus.qk_norm_after_rotary) == \
        ("xielu", False, True, False)
    assert dict(apertus.rope_scaling)["type"] == "llama3" and apertus.rope_theta == 12e6
    assert get_model(str(_write(tmp_path, {"model_type": "apertus", "hidden_act": "relu2"}))).activation == "relu2"
    with pytest.raises(SailorError, match="the xIELU activation goes in an ungated dense MLP"):
        replace(apertus, gated_mlp=True)
    with pytest.raises(SailorError, match="xielu MLP"):
        megatron_model_args(replace(apertus, qk_norm=False))


def test_vaultgemma_is_gemma2_without_output_norms(tmp_path):
    """VaultGemma's config reads as Gemma 2's (every other block windowed, the soft caps, the attention scale) with
    no norms on the sublayers' outputs; parameters as transformers counts them."""
    cfg = {"model_type": "vaultgemma", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
           "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
           "max_position_embeddings": 1024, "sliding_window": 512, "query_pre_attn_scalar": 256}
    vault = get_model(str(_write(tmp_path, cfg)))
    gemma2 = get_model(str(_write(tmp_path, {**cfg, "model_type": "gemma2"})))
    assert not vault.sandwich_norm and gemma2.sandwich_norm
    assert replace(vault, name="", hf_model_type="", sandwich_norm=True) == \
        replace(gemma2, name="", hf_model_type="")
    assert vault.windows[:4] == (512, 0, 512, 0) and vault.attn_softcap == 50.0
    assert vault.total_params(padded=False) == transformers_count(cfg) == \
        gemma2.total_params(padded=False) - 2 * 26 * 1152


def test_hunyuan_details(tmp_path):
    """HunYuan's q/k norms come after the rotary positions; its rope type dynamic with an alpha is NTK alpha (a
    base of 10^4 * 1000^(128 / 126), as transformers' HunYuan computes it), written back as it came; elsewhere an
    alpha is not read and dynamic is the default inside the context. Experts and top-k per block must agree."""
    model = get_model(str(_write(tmp_path, PUBLISHED["Hunyuan-A13B"][0])))
    assert model.qk_norm and model.qk_norm_after_rotary and dict(model.rope_scaling) == {"type": "ntk_alpha",
                                                                                        "alpha": 1000.0}
    assert (model.experts, model.experts_per_token, model.shared_expert_ffn, model.shared_expert_gated) == \
        (64, 8, 3072, False)
    from planner.specs.families import to_hf_config

    assert to_hf_config(model)["rope_parameters"] == {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 1.0,
                                                      "alpha": 1000.0}
    torch = pytest.importorskip("torch")
    from sailor_ext.attention import inverse_frequencies

    theirs = 1.0 / ((1e4 * 1000.0 ** (128 / 126)) ** (torch.arange(0, 128, 2, dtype=torch.float) / 128))
    assert torch.equal(inverse_frequencies(model), theirs)
    llama = get_model(str(_write(tmp_path, {**PUBLISHED["Llama-3-8B"][0],
                                            "rope_scaling": _HUNYUAN_7B["rope_scaling"]})))
    assert dict(llama.rope_scaling) == {"type": "dynamic", "factor": 1.0}
    alias = get_model(str(_write(tmp_path, {**PUBLISHED["Hunyuan-A13B"][0], "num_experts_per_tok": 4})))
    assert alias.experts_per_token == 4  # (transformers' attribute_map: the alias wins)
    with pytest.raises(SailorError, match=r"moe_topk differs between blocks \(\[8, 8, .*\), which sailor does not "
                                          "train; give one value for every block"):
        get_model(str(_write(tmp_path, {**PUBLISHED["Hunyuan-A13B"][0], "moe_topk": [8] * 31 + [4]})))


def test_architecture_details(tmp_path):
    opt = get_model(str(_write(tmp_path, PUBLISHED["opt-350m"][0])))
    assert (opt.word_dim, opt.post_norm, opt.final_norm, opt.tied_embeddings, opt.position_rows) == \
        (512, True, False, True, 2050)
    neo = get_model(str(_write(tmp_path, PUBLISHED["gpt-neo-2.7B"][0])))
    assert not neo.qkv_bias and neo.out_bias and neo.attention_scale == 1.0
    assert neo.windows[:4] == (0, 256, 0, 256)
    qwen = get_model(str(_write(tmp_path, PUBLISHED["Qwen2-0.5B"][0])))
    assert qwen.qkv_bias and not qwen.out_bias and qwen.num_query_groups == 2 and qwen.windows == ()
    mistral = get_model(str(_write(tmp_path, PUBLISHED["Mistral-7B"][0])))
    assert mistral.windows == (4096,) * 32
    qwen3 = get_model(str(_write(tmp_path, PUBLISHED["Qwen3-0.6B"][0])))
    assert qwen3.qk_norm and not qwen3.qkv_bias and not qwen3.out_bias and qwen3.q_dim == 2048
    assert qwen3.total_params(padded=False) - 151936 * 1024 == 440_467_456
    # transformers' default head dimension for qwen3 is 128, whatever hidden_size / num_attention_heads is
    no_head_dim = {k: v for k, v in PUBLISHED["Qwen3-0.6B"][0].items() if k != "head_dim"}
    assert get_model(str(_write(tmp_path, {**no_head_dim, "hidden_size": 512}))).head_dim == 128
    windowed = {**no_head_dim, "use_sliding_window": True, "sliding_window": 512, "max_window_layers": 26}
    assert get_model(str(_write(tmp_path, windowed))).windows == (0,) * 26 + (512,) * 2


def test_sequence_length_default_and_limit(tmp_path):
    path = str(_write(tmp_path, PUBLISHED["Qwen2-0.5B"][0]))
    assert get_model(path).seq_len == 2048 and get_model(path).context_length == 131072
    assert get_model(path, seq_len=4096).seq_len == 4096
    gpt2 = str(_write(tmp_path, PUBLISHED["gpt2"][0]))
    assert get_model(gpt2).seq_len == 1024  # its context is shorter than 2048
    with pytest.raises(SailorError, match="--seq-length 2048 exceeds the context length 1024"):
        get_model(gpt2, seq_len=2048)
    assert get_model("llama-3-8b").seq_len == 8192  # Sailor's preset keeps the length of its measured runs


def test_llama3_rope_scaling_is_read(tmp_path):
    cfg = dict(PUBLISHED["Llama-3-8B"][0], rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, max_position_embeddings=131072)
    model = get_model(str(_write(tmp_path, cfg)))
    assert dict(model.rope_scaling) == {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192.0}
    assert model.rope_theta == 500000.0


@pytest.mark.parametrize("change, needle", [
    ({"model_type": "bert"}, "model_type 'bert' is not supported"),
    ({"hidden_size": "4096"}, "hidden_size must be a positive integer"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    ({"num_hidden_layers": 10**6}, "beyond 4096"),
    ({"num_key_value_heads": 5}, "32 heads not divisible by kv_heads 5"),
    ({"hidden_act": "mish"}, "hidden_act 'mish' is not supported"),
    ({"rope_scaling": {"rope_type": "proportional", "factor": 4.0}}, "rope type 'proportional' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope original_max_position_embeddings must be"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                       "truncate": "no"}}, "rope truncate must be true or false, not 'no'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope low_freq_factor must be a positive number"),
    ({"pad_token_id": 200000}, "pad token 200000 is outside the vocabulary"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
])
def test_bad_config_is_one_clear_error(tmp_path, change, needle):
    cfg = {k: v for k, v in PUBLISHED["Llama-3-8B"][0].items()}
    cfg.update(change)
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, cfg)))


def test_phi3_details(tmp_path):
    phi3 = get_model(str(_write(tmp_path, PUBLISHED["Phi-3-mini-4k"][0])))
    assert phi3.family == "phi3" and phi3.windows == (2047,) * 32 and phi3.rotary_dim == 96 and not phi3.qkv_bias
    mini = dict(PUBLISHED["phi-4"][0], rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.75})
    assert get_model(str(_write(tmp_path, mini))).rotary_dim == 96  # 3/4 of 128
    assert get_model(str(_write(tmp_path, dict(PUBLISHED["phi-4"][0], partial_rotary_factor=0.5)))).rotary_dim == 64


def test_longrope_details(tmp_path):
    cfg = PUBLISHED["Phi-3.5-mini"][0]
    model = get_model(str(_write(tmp_path, cfg)))
    scaling = dict(model.rope_scaling)
    assert scaling["type"] == "longrope" and scaling["original_max_position_embeddings"] == 4096
    assert scaling["attention_factor"] == pytest.approx((1 + math.log(32) / math.log(4096)) ** 0.5)  # 131072 / 4096
    assert scaling["short_factor"] == (1.0,) * 48 and scaling["long_factor"] == (2.0,) * 48
    # set by the config; Phi-3's early names for the type
    given = {**cfg, "rope_scaling": {**cfg["rope_scaling"], "type": "su", "attention_factor": 1.5}}
    assert dict(get_model(str(_write(tmp_path, given))).rope_scaling)["attention_factor"] == 1.5
    # a plan carries the model description: the factors come back as they went
    from planner.specs.model import model_from_dict

    assert model_from_dict(json.loads(json.dumps(model.to_dict()))) == model


@pytest.mark.parametrize("change, needle", [
    ({"short_factor": [1.0] * 47}, "one factor per rotated pair of head dimensions, 48"),
    ({"long_factor": "2.0"}, "rope long_factor must be a list of positive numbers, not '2.0'"),
    ({"long_factor": [2.0] * 47 + [0]}, "rope long_factor must be a list of positive numbers"),
    ({"original_max_position_embeddings": 0.5}, "original_max_position_embeddings must be the original context"),
    ({"attention_factor": -1}, "rope attention_factor must be a positive number, not -1"),
    ({"factor": "x"}, "rope factor must be a positive number, not 'x'"),
])
def test_bad_longrope_is_one_clear_error(tmp_path, change, needle):
    cfg = PUBLISHED["Phi-3.5-mini"][0]
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**cfg, "rope_scaling": {**cfg["rope_scaling"], **change}})))


@pytest.mark.parametrize("change, needle", [
    ({"partial_rotary_factor": 0}, "partial_rotary_factor must be above 0 and at most 1, not 0"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be above 0 and at most 1, not 1.5"),
    ({"partial_rotary_factor": 0.001}, "rotating at least 2 of the 96 dimensions"),
    ({"head_dim": 128}, "phi3 takes its head dimension from hidden_size / num_attention_heads; remove head_dim"),
    ({"rope_scaling": {"type": "proportional", "factor": 2.0}}, "rope type 'proportional' is not supported"),
])
def test_bad_phi3_config_is_one_clear_error(tmp_path, change, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**PUBLISHED["Phi-3-mini-4k"][0], **change})))


def test_gpt_neox_details(tmp_path):
    pythia = get_model(str(_write(tmp_path, PUBLISHED["pythia-160m"][0])))
    assert pythia.family == "gpt-neox" and pythia.parallel_residual and pythia.rotary_dim == 16
    assert not pythia.rms_norm and pythia.qkv_bias and pythia.mlp_bias and not pythia.learned_positions
    newer = {k: v for k, v in PUBLISHED["pythia-160m"][0].items() if k not in ("rotary_pct", "rotary_emb_base")}
    newer["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
    model = get_model(str(_write(tmp_path, newer)))
    assert (model.rotary_dim, model.rope_theta) == (32, 500.0)


@pytest.mark.parametrize("change, needle", [
    ({"rotary_pct": 0}, "rotary_pct must be above 0 and at most 1, not 0"),
    ({"rotary_pct": "all"}, "rotary_pct must be above 0 and at most 1, not 'all'"),
    ({"rotary_emb_base": -1}, "rope_theta must be a positive number, not -1"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic' is not supported for gpt_neox"),
    ({"use_parallel_residual": 1}, "use_parallel_residual must be true or false"),
])
def test_bad_gpt_neox_config_is_one_clear_error(tmp_path, change, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**PUBLISHED["pythia-160m"][0], **change})))


def test_gemma_details(tmp_path):
    gemma = get_model(str(_write(tmp_path, PUBLISHED["gemma-7b"][0])))
    assert (gemma.family, gemma.activation, gemma.head_dim, gemma.q_dim) == ("gemma", "gelu_tanh", 256, 4096)
    assert gemma.norm_offset and gemma.embedding_multiplier == 3072 ** 0.5 and gemma.tied_embeddings
    assert not gemma.sandwich_norm
    assert gemma.pad_token == 0  # transformers' default: the padding row is not trained
    gemma2 = get_model(str(_write(tmp_path, PUBLISHED["gemma-2-27b"][0])))
    assert gemma2.family == "gemma2" and gemma2.sandwich_norm and not gemma2.qk_norm
    assert gemma2.windows[:4] == (4096, 0, 4096, 0)  # every other block, from the first
    assert (gemma2.attn_softcap, gemma2.logit_softcap) == (50.0, 30.0)
    assert gemma2.attention_scale == pytest.approx(144 ** -0.5)  # query_pre_attn_scalar, not head_dim 128
    gemma3 = get_model(str(_write(tmp_path, PUBLISHED["gemma-3-1b"][0])))
    assert gemma3.qk_norm and gemma3.sandwich_norm and (gemma3.attn_softcap, gemma3.logit_softcap) == (0, 0)
    assert gemma3.windows[:6] == (512,) * 5 + (0,) and gemma3.attention_scale == 0
    assert (gemma3.rope_theta, gemma3.local_rope_theta) == (1e6, 1e4)
    # the 4B's linear scaling belongs to the full blocks only; transformers 5 writes it per layer type
    scaled = dict(PUBLISHED["gemma-3-1b"][0], rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert dict(get_model(str(_write(tmp_path, scaled))).rope_scaling) == {"type": "linear", "factor": 8.0}
    per_type = dict(PUBLISHED["gemma-3-1b"][0], rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}})
    model = get_model(str(_write(tmp_path, per_type)))
    assert (dict(model.rope_scaling), model.rope_theta, model.local_rope_theta) == \
        ({"type": "linear", "factor": 8.0}, 1e6, 2e4)


@pytest.mark.parametrize("name, change, needle", [
    # a multimodal Gemma 3's language model is its text_config, which this one lacks
    ("gemma-3-1b", {"model_type": "gemma3"}, "config.json text_config: missing field 'num_hidden_layers'"),
    ("gemma-3-1b", {"use_bidirectional_attention": True}, "bidirectional attention .* is not supported"),
    ("gemma-3-1b", {"rope_local_base_freq": 0}, "rope_local_base_freq must be a positive number, not 0"),
    ("gemma-3-1b", {"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0}}},
     "rope type 'yarn' of the sliding-window layers is not supported"),
    ("gemma-2-2b", {"attn_logit_softcapping": -50}, "attn_logit_softcapping must be a positive number, not -50"),
    ("gemma-2-2b", {"hidden_activation": "gelu_erf"}, "hidden_activation 'gelu_erf' is not supported"),
    ("gemma-2-2b", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a positive number, not 0"),
    ("gemma-2-2b", {"layer_types": ["full_attention"]}, "layer_types must list .* for each of the 26 layers"),
    # an odd head dimension: the runtime's rotary positions failed on it after `sailor plan` had taken it
    ("gemma-2-2b", {"head_dim": 9}, "rotary positions turn pairs of dimensions, and 9 of each head's 9 would turn"),
    ("Llama-3-8B", {"head_dim": 127}, "make head_dim .* even"),
])
def test_bad_gemma_config_is_one_clear_error(tmp_path, name, change, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**PUBLISHED[name][0], **change})))


def test_starcoder2_details(tmp_path):
    model = get_model(str(_write(tmp_path, PUBLISHED["starcoder2-3b"][0])))
    assert model.family == "starcoder2" and not model.rms_norm and not model.gated_mlp and model.separate_final_norm
    assert model.qkv_bias and model.out_bias and model.mlp_bias and model.tied_embeddings
    assert (model.num_query_groups, model.windows, model.activation) == (2, (4096,) * 30, "gelu_tanh")
    plain = {k: v for k, v in PUBLISHED["starcoder2-3b"][0].items() if k != "sliding_window"}
    no_bias = get_model(str(_write(tmp_path, {**plain, "use_bias": False})))
    assert no_bias.windows == () and not (no_bias.qkv_bias or no_bias.out_bias or no_bias.mlp_bias)
    with pytest.raises(SailorError, match="norm_epsilon must be a positive number"):
        get_model(str(_write(tmp_path, {**plain, "norm_epsilon": 0})))


def test_granite_details(tmp_path):
    """Granite-3.0-2B's shapes and multipliers; its size is transformers' (checked live where installed)."""
    cfg = {"model_type": "granite", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 49155, "max_position_embeddings": 4096,
           "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "embedding_multiplier": 12.0,
           "residual_multiplier": 0.22, "attention_multiplier": 0.015625, "logits_scaling": 8.0}
    model = get_model(str(_write(tmp_path, cfg)))
    assert (model.family, model.embedding_multiplier, model.residual_multiplier, model.attention_scale,
            model.logits_divisor) == ("llama", 12.0, 0.22, 0.015625, 8.0)
    # transformers' default attention multiplier is 1, not 1 / sqrt(head_dim)
    plain = {k: v for k, v in cfg.items() if k != "attention_multiplier"}
    assert get_model(str(_write(tmp_path, plain))).attention_scale == 1.0
    with pytest.raises(SailorError, match="residual_multiplier must be a positive number, not 0"):
        get_model(str(_write(tmp_path, {**cfg, "residual_multiplier": 0})))
    assert model.total_params(padded=False) == transformers_count(cfg)


def test_cohere_details(tmp_path):
    """Command R's shapes: one LayerNorm without bias per block, rotary on adjacent pairs, scaled logits; its size
    is transformers' (checked live where installed)."""
    cfg = {"model_type": "cohere", "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
           "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 256000,
           "max_position_embeddings": 131072, "rope_theta": 8000000.0, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
           "use_qk_norm": False}
    model = get_model(str(_write(tmp_path, cfg)))
    assert model.family == "cohere" and model.parallel_residual and model.shared_norm and model.rotary_interleaved
    assert not model.norm_bias and not model.rms_norm and model.logits_divisor == 16.0 and model.tied_embeddings
    # one norm weight, no bias
    assert model.params(1) - model._attention_weights() - model._mlp_matmul_weights() == 8192
    plus = get_model(str(_write(tmp_path, {**cfg, "use_qk_norm": True})))  # Command R+'s per-head q/k LayerNorms
    assert plus.qk_norm and plus.qk_norm_per_head and plus.params(1, tp=2) - model.params(1, tp=2) == 128 * 64
    with pytest.raises(SailorError, match="use_qk_norm must be true or false"):
        get_model(str(_write(tmp_path, {**cfg, "use_qk_norm": 1})))
    with pytest.raises(SailorError, match="logit_scale must be a positive number, not 0"):
        get_model(str(_write(tmp_path, {**cfg, "logit_scale": 0})))
    assert model.total_params(padded=False) == transformers_count(cfg)


def test_moe_details(tmp_path):
    """The router's choices and the experts' width; the planner counts the experts a token passes through."""
    mixtral = get_model(str(_write(tmp_path, PUBLISHED["Mixtral-8x7B"][0])), seq_len=4096)
    assert (mixtral.family, mixtral.experts, mixtral.experts_per_token, mixtral.expert_renorm, mixtral.ffn_hidden) \
        == ("mixtral", 8, 2, True, 14336)
    qwen = get_model(str(_write(tmp_path, PUBLISHED["Qwen3-30B-A3B"][0])), seq_len=4096)
    assert (qwen.experts, qwen.experts_per_token, qwen.expert_renorm, qwen.ffn_hidden, qwen.qk_norm) == \
        (128, 8, True, 768, True)
    dense = replace(qwen, experts=0, experts_per_token=0)
    # a block's forward FLOPs: 8 of the 128 experts' MLPs and the router (2 * 128 * h), not all 128
    mlp = 2 * 3 * 2048 * 768
    assert qwen.forward_flops(1) - dense.forward_flops(1) == 7 * mlp + 2 * 128 * 2048
    assert qwen.params(1, tp=4) - dense.params(1, tp=4) == 127 * 3 * 2048 * 768 // 4 + 128 * 2048
    # about 3.3 B parameters take part in a token's forward, as Qwen3-30B-A3B's model card says
    active = qwen.total_params(padded=False) - qwen.num_blocks * 120 * 3 * 2048 * 768
    assert 3.3e9 <= active < 3.4e9


@pytest.mark.parametrize("name, change, needle", [
    ("Mixtral-8x7B", {"output_router_logits": True}, "output_router_logits adds a load-balancing loss pooled over "
     "all blocks and the whole batch, which no pipeline of microbatches computes; set it to false and balance per "
     "sequence with the training argument --moe-aux-loss-coeff 0.02"),
    ("Mixtral-8x7B", {"router_jitter_noise": 0.1}, "router_jitter_noise is not supported; set it to 0"),
    ("Mixtral-8x7B", {"num_experts_per_tok": 9}, "each token goes to 1 to 8 of the 8 experts, not 9"),
    ("Mixtral-8x7B", {"num_local_experts": "8"}, "num_local_experts must be a positive integer"),
    ("Mixtral-8x7B", {"mlp_bias": True}, "experts' linears have no biases"),
    ("Qwen3-30B-A3B", {"mlp_only_layers": [0]}, "dense blocks among the experts'"),
    ("Qwen3-30B-A3B", {"decoder_sparse_step": 2}, "dense blocks among the experts'"),
    ("Qwen3-30B-A3B", {"moe_intermediate_size": 0}, "moe_intermediate_size must be a positive integer"),
    ("Qwen3-30B-A3B", {"model_type": "qwen2_moe", "shared_expert_intermediate_size": 1.5},
     "shared_expert_intermediate_size must be a positive integer"),
    ("granite-3.0-3b-a800m", {"model_type": "granitemoeshared", "shared_intermediate_size": -64},
     "shared_intermediate_size must be a positive integer"),
    ("granite-3.0-3b-a800m", {"output_router_logits": True, "router_aux_loss_coef": 0.001},
     "--moe-aux-loss-coeff 0.001"),
])
def test_bad_moe_config_is_one_clear_error(tmp_path, name, change, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**PUBLISHED[name][0], **change})))


OLMO2_7B = {"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352, "max_position_embeddings": 4096,
            "rope_theta": 500000, "rms_norm_eps": 1e-6, "attention_bias": False, "tie_word_embeddings": False,
            "pad_token_id": 100277, "eos_token_id": 100257}
OLMOE_1B_7B = {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
               "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 50304,
               "max_position_embeddings": 4096, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False,
               "clip_qkv": None, "rope_theta": 10000, "rms_norm_eps": 1e-5, "pad_token_id": 1, "eos_token_id": 50279,
               "tie_word_embeddings": False}


def test_olmo_details(tmp_path):
    """OLMo-2-7B and OLMoE-1B-7B: 7.3 B and 6.9 B parameters (1.3 B of them active in OLMoE) as their model
    cards round them, exactly transformers' count (checked live where installed)."""
    olmo2 = get_model(str(_write(tmp_path, OLMO2_7B)))
    assert olmo2.family == "olmo2" and olmo2.qk_norm_full and olmo2.sandwich_norm and not olmo2.input_norms
    assert olmo2.block_norms == 2 and olmo2.pad_token == 100277
    assert round(olmo2.total_params(padded=False) / 1e9, 1) == 7.3
    assert olmo2.total_params(padded=False) == transformers_count(OLMO2_7B)
    # the q and k norms are as wide as q and k, split over TP with the heads
    per_head = replace(olmo2, qk_norm_full=False)
    assert olmo2.params(1, tp=4) - per_head.params(1, tp=4) == 2 * 4096 // 4 - 2 * 128
    olmoe = get_model(str(_write(tmp_path, OLMOE_1B_7B)))
    assert (olmoe.family, olmoe.experts, olmoe.experts_per_token, olmoe.expert_renorm, olmoe.ffn_hidden) == \
        ("olmoe", 64, 8, False, 1024)
    assert olmoe.qk_norm_full and olmoe.input_norms and not olmoe.sandwich_norm
    total = olmoe.total_params(padded=False)
    assert round(total / 1e9, 1) == 6.9 and total == transformers_count(OLMOE_1B_7B)
    assert round((total - 16 * 56 * 3 * 2048 * 1024) / 1e9, 1) == 1.3
    no_pad = get_model(str(_write(tmp_path, {k: v for k, v in OLMOE_1B_7B.items() if k != "pad_token_id"})))
    assert no_pad.pad_token == 1  # transformers' default for both: that row is never trained
    with pytest.raises(SailorError, match="clip_qkv is not supported; set it to null"):
        get_model(str(_write(tmp_path, {**OLMOE_1B_7B, "clip_qkv": 8.0})))


def test_olmo3_details(tmp_path):
    """OLMo 3's shape (7B, 65k context by YaRN on its full blocks): three blocks in four windowed, the
    windowed ones unscaled; the older rope_theta/rope_scaling fields read as transformers reads them."""
    cfg = {**OLMO2_7B, "model_type": "olmo3", "vocab_size": 100278, "max_position_embeddings": 65536,
           "sliding_window": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32, "beta_slow": 1,
                                                    "original_max_position_embeddings": 8192,
                                                    "attention_factor": 1.2079441541679836}}
    model = get_model(str(_write(tmp_path, cfg)), seq_len=4096)
    assert model.family == "olmo2" and model.hf_model_type == "olmo3" and model.qk_norm_full
    assert model.windows == (4096, 4096, 4096, 0) * 8
    scaling = dict(model.rope_scaling)
    assert (scaling["type"], scaling["factor"], model.rope_theta, model.local_rope_theta) == \
        ("yarn", 8.0, 500000.0, 500000.0)
    assert model.total_params(padded=False) == transformers_count(cfg)
    per_type = {**{k: v for k, v in cfg.items() if k != "rope_scaling"}, "layer_types": ["full_attention"] * 32,
                "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    unwindowed = get_model(str(_write(tmp_path, per_type)))
    assert unwindowed.windows == () and unwindowed.local_rope_theta == 0 and unwindowed.rope_theta == 1e6
    with pytest.raises(SailorError, match="rope type 'linear' is not supported for olmo3's sliding-window blocks"):
        bad = {**per_type, "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}}
        get_model(str(_write(tmp_path, bad)))
    with pytest.raises(SailorError, match="rope type 'longrope' is not supported for olmo3; use yarn"):
        get_model(str(_write(tmp_path, {**cfg, "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})))


_BASE = {"hidden_size": 256, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 32,
         "vocab_size": 300, "max_position_embeddings": 64}
_MINIMAL = {"gpt2": {"n_embd": 256, "n_layer": 2, "n_head": 32, "vocab_size": 300, "n_positions": 64},
            "gpt_bigcode": {"n_embd": 256, "n_layer": 2, "n_head": 32, "vocab_size": 300, "n_positions": 64},
            "gpt_neo": {"hidden_size": 256, "num_layers": 2, "num_heads": 32, "vocab_size": 300,
                        "max_position_embeddings": 64, "attention_types": [[["global", "local"], 1]]},
            "opt": {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 32, "ffn_dim": 96,
                    "vocab_size": 300, "max_position_embeddings": 64},
            # (their default pad tokens, 32000, 128004, 151329 and 100277, must be in the vocabulary)
            "phi3": {**_BASE, "vocab_size": 32064}, "smollm3": {**_BASE, "vocab_size": 128256},
            "glm": {**_BASE, "vocab_size": 151552}, "glm4": {**_BASE, "vocab_size": 151552},
            "flex_olmo": {**_BASE, "vocab_size": 100352},
            # (heads x its default head_dim 128 = hidden_size; heads a multiple of its default 20 KV heads)
            "helium": {**_BASE, "hidden_size": 2560, "num_attention_heads": 20},
            # (transformers has no default for its experts per token)
            "deepseek_v2": {**_BASE, "num_experts_per_tok": 6},
            "dots1": {**_BASE, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
            # (heads of 64, as wide as its default rotary_dim)
            "gptj": {"n_embd": 256, "n_layer": 2, "n_head": 4, "vocab_size": 300, "n_positions": 64},
            # the multimodal ones' language models (Mistral 3's tie named: transformers ties by default, unlike
            # us, test_multimodal_details)
            "gemma3": {"text_config": {**_BASE, "model_type": "gemma3_text"}},
            "mistral3": {"text_config": {**_BASE, "model_type": "mistral"}, "tie_word_embeddings": False},
            "qwen3_vl": {"text_config": {**_BASE, "model_type": "qwen3_vl_text"}},
            "qwen2_vl": {"text_config": {**_BASE, "model_type": "qwen2_vl_text"}},
            "qwen2_5_vl": {"text_config": {**_BASE, "model_type": "qwen2_5_vl_text"}}}


@pytest.mark.parametrize("model_type", sorted(hf_types()))
def test_fields_a_config_leaves_out_are_transformers_defaults(model_type, tmp_path):
    """A config.json with only the shape reads as the config transformers builds from it and saves with
    every field filled in: the same model, field for field."""
    transformers = pytest.importorskip("transformers")
    cfg = {"model_type": model_type, **_MINIMAL.get(model_type, _BASE)}
    ours = get_model(str(_write(tmp_path, cfg)))
    transformers.AutoConfig.for_model(**cfg).save_pretrained(tmp_path / "saved")
    theirs = get_model(str(tmp_path / "saved"))
    assert replace(ours, name="").to_dict() == replace(theirs, name="").to_dict()


def test_qwen2_moe_details(tmp_path):
    """Qwen1.5-MoE-A2.7B: 14.3 B parameters, 2.7 B of them active (4 of 60 experts and the shared one), as its
    model card rounds them, exactly transformers' count; its published config's window is off."""
    cfg = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
           "num_key_value_heads": 16, "vocab_size": 151936, "max_position_embeddings": 8192, "num_experts": 60,
           "num_experts_per_tok": 4, "norm_topk_prob": False, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 32768,
           "max_window_layers": 21, "decoder_sparse_step": 1}
    model = get_model(str(_write(tmp_path, cfg)))
    assert (model.experts, model.experts_per_token, model.ffn_hidden, model.shared_expert_ffn) == (60, 4, 1408, 5632)
    assert model.qkv_bias and not model.out_bias and model.windows == () and not model.expert_renorm
    total = model.total_params(padded=False)
    assert round(total / 1e9, 1) == 14.3 and total == transformers_count(cfg)
    assert round((total - 24 * 56 * 3 * 2048 * 1408) / 1e9, 1) == 2.7
    windowed = get_model(str(_write(tmp_path, {**cfg, "use_sliding_window": True, "sliding_window": 4096})))
    assert windowed.windows == (4096, 0) * 10 + (4096,) + (0,) * 3  # odd blocks below max_window_layers (21)
    assert model.tp_degrees(8) == [1, 2, 4, 8]
    assert replace(model, shared_expert_ffn=5636).tp_degrees(8) == [1, 2, 4]  # the shared expert splits over TP too


def test_smollm3_and_ernie45_details(tmp_path):
    """SmolLM3-3B's shape: every fourth block without rotary positions (the default of no_rope_layers), which
    the planner counts without rotary work; ERNIE-4.5-0.3B's: heads of 128 on a 1024-wide model, adjacent pairs
    rotated. Parameter counts are transformers' own; Megatron-LM launch refuses the NoPE blocks."""
    from planner.profiles.layer_work import layer_work
    from planner.targets.megatron_lm import megatron_model_args

    smol = {"model_type": "smollm3", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
            "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 128256,
            "max_position_embeddings": 65536, "rope_theta": 5e6, "tie_word_embeddings": True}
    model = get_model(str(_write(tmp_path, smol)), seq_len=4096)
    assert model.nope_blocks == tuple(range(3, 36, 4)) and model.windows == () and model.tied_embeddings
    assert model.total_params(padded=False) == transformers_count(smol)
    assert round(model.total_params(padded=False) / 1e9, 1) == 3.1
    with_rope, without = (layer_work(model, layer, 1, 1, 2)[0] for layer in (1, 4))  # blocks 0 and 3
    assert without.bytes < with_rope.bytes and without.kernels == with_rope.kernels - 6
    explicit = get_model(str(_write(tmp_path, {**smol, "no_rope_layers": [0] + [1] * 35})))
    assert explicit.nope_blocks == (0,)
    with pytest.raises(SailorError, match="no_rope_layers must list 1 .* or 0 .* for each of the 36 layers"):
        get_model(str(_write(tmp_path, {**smol, "no_rope_layers": [1, 0]})))
    with pytest.raises(SailorError, match="blocks without rotary positions"):
        megatron_model_args(model)
    ernie = {"model_type": "ernie4_5", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18,
             "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 103424,
             "max_position_embeddings": 131072, "rope_theta": 500000.0}
    model = get_model(str(_write(tmp_path, ernie)))
    assert (model.head_dim, model.rotary_interleaved, model.tied_embeddings, model.qkv_bias) == (128, True, True, False)
    assert model.total_params(padded=False) == transformers_count(ernie)
    assert round(model.total_params(padded=False) / 1e9, 2) == 0.36


def test_cohere2_details(tmp_path):
    """Command R7B's shape (Cohere 2): three blocks in four windowed and rotated (sliding_window_pattern 4), the
    fourth full and without rotary positions; transformers' parameter count; no window, no rotation."""
    cfg = {"model_type": "cohere2", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 256000, "max_position_embeddings": 8192,
           "sliding_window": 4096, "sliding_window_pattern": 4, "rope_theta": 50000.0, "logit_scale": 0.25}
    model = get_model(str(_write(tmp_path, cfg)), seq_len=8192)
    assert model.windows == (4096, 4096, 4096, 0) * 8 and model.nope_blocks == tuple(range(3, 32, 4))
    assert model.shared_norm and model.rotary_interleaved and model.tied_embeddings
    assert model.total_params(padded=False) == transformers_count(cfg)
    unwindowed = get_model(str(_write(tmp_path, {**cfg, "sliding_window": None})))
    assert unwindowed.windows == () and unwindowed.nope_blocks == tuple(range(32))
    with pytest.raises(SailorError, match="layer_types must list full_attention or sliding_attention for each of "
                                          "the 32 layers"):
        get_model(str(_write(tmp_path, {**cfg, "layer_types": ["full_attention"]})))


def test_glm_details(tmp_path):
    """GLM-4-9B-0414's shape (glm4): q/k/v biases only, half of each head rotated, sandwich norms; GLM-4-9B-chat-hf
    (glm) without the sandwich norms; transformers' parameter counts."""
    cfg = {"model_type": "glm4", "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
           "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 151552,
           "max_position_embeddings": 32768, "partial_rotary_factor": 0.5, "attention_bias": True,
           "rope_theta": 10000.0, "tie_word_embeddings": False}
    for model_type in ("glm4", "glm"):
        model = get_model(str(_write(tmp_path, {**cfg, "model_type": model_type})))
        assert (model.qkv_bias, model.out_bias, model.rotary_fraction, model.rotary_interleaved) == \
            (True, False, 0.5, True)
        assert model.sandwich_norm == (model_type == "glm4") and model.family == "glm"
        assert model.total_params(padded=False) == transformers_count({**cfg, "model_type": model_type})
    assert round(get_model(str(_write(tmp_path, cfg))).total_params(padded=False) / 1e9, 1) == 9.4


def test_exaone4_details(tmp_path):
    """EXAONE 4.0's shapes: with a window, the pattern "LLLG" windows three blocks in four and leaves the fourth
    full and without rotary positions; without one (the 1.2B), every block is full and rotary; transformers'
    parameter counts."""
    cfg = {"model_type": "exaone4", "hidden_size": 5120, "intermediate_size": 27392, "num_hidden_layers": 64,
           "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 102400,
           "max_position_embeddings": 131072, "sliding_window": 4096, "sliding_window_pattern": "LLLG",
           "rope_theta": 1e6, "tie_word_embeddings": False}
    model = get_model(str(_write(tmp_path, cfg)), seq_len=4096)
    assert model.windows == (4096, 4096, 4096, 0) * 16 and model.nope_blocks == tuple(range(3, 64, 4))
    assert model.qk_norm and not model.qk_norm_full and not model.input_norms and model.sandwich_norm
    types = {**cfg, "sliding_window_pattern": 4,
             "layer_types": ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(64)]}
    assert model.total_params(padded=False) == transformers_count(types)
    small = get_model(str(_write(tmp_path, {**cfg, "sliding_window": None})))
    assert small.windows == () and small.nope_blocks == ()
    with pytest.raises(SailorError, match="sliding_window_pattern must be a positive integer or letters L "
                                          r"\(windowed\) and G \(full\), not 'LLXG'"):
        get_model(str(_write(tmp_path, {**cfg, "sliding_window_pattern": "LLXG"})))


def test_gpt_oss_details(tmp_path):
    """gpt-oss-20b's config as published (MXFP4 experts): every second block windowed to 128 tokens, YaRN,
    attention sinks, biases on attention, router and experts, the clamped GLU; other quantizations and
    transformers' pooled balancing loss are refused."""
    cfg, _ = PUBLISHED["gpt-oss-20b"]
    published = {**cfg, "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
    model = get_model(str(_write(tmp_path, published)), seq_len=4096)
    assert model.windows == (128, 0) * 12 and model.experts == 32 and model.experts_per_token == 4
    assert model.attention_sinks and model.router_bias and model.mlp_bias and model.qkv_bias and model.out_bias
    assert (model.glu_limit, model.glu_alpha, model.expert_renorm) == (7.0, 1.702, True)
    scaling = dict(model.rope_scaling)
    assert scaling["type"] == "yarn" and scaling["factor"] == 32 and scaling["attention_factor"] == \
        pytest.approx(0.1 * math.log(32) + 1) and not scaling["truncate"]
    # without layer_types, every second block is full (transformers' default)
    assert get_model(str(_write(tmp_path, {k: v for k, v in cfg.items() if k != "layer_types"}))).windows == \
        (128, 0) * 12
    for change, needle in (({"quantization_config": {"quant_method": "gptq"}}, "quantization 'gptq' is not "
                                                                                 "supported"),
                           ({"quantization_config": {}}, "quantization_config names no quant_method"),
                           ({"swiglu_limit": -1}, "swiglu_limit must be a positive number"),
                           ({"swiglu_alpha": 1e31}, "swiglu_alpha 1e[+]31 is beyond 1e30"),
                           ({"output_router_logits": True}, "--moe-aux-loss-coeff"),
                           ({"partial_rotary_factor": 0.5}, "gpt_oss rotates whole heads"),
                           ({"rope_parameters": {"full_attention": {"rope_type": "default"}}},
                            "gpt_oss takes one rope_parameters for every block")):
        with pytest.raises(SailorError, match=needle):
            get_model(str(_write(tmp_path, {**cfg, **change})))


@pytest.mark.parametrize("rope", [{"rope_scaling": {}}, {"rope_scaling": {"rope_theta": 1e4}},
                                  {"rope_parameters": {}},
                                  {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                                   "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 16}},
                                  {"num_experts": 4}],
                         ids=["empty-scaling", "theta-in-scaling", "empty-parameters", "both", "experts-alias"])
def test_gpt_oss_reads_its_rope_and_experts_as_transformers(rope, tmp_path):
    """gpt-oss's positions and expert count as transformers reads them: an empty rope_scaling is no rope_scaling
    (gpt-oss's YaRN), a rope_theta inside rope_scaling wins over the top-level one, an empty rope_parameters is
    plain RoPE, a non-empty rope_scaling wins over rope_parameters; num_experts names num_local_experts. Ours from
    the config as written equals ours from the config transformers saves from it."""
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in PUBLISHED["gpt-oss-20b"][0].items() if k not in ("rope_scaling", "rope_theta")}
    cfg = {**cfg, **rope}
    if "num_experts" in cfg:
        del cfg["num_local_experts"]
    ours = get_model(str(_write(tmp_path, cfg)))
    config = transformers.AutoConfig.for_model(**cfg)
    assert (ours.rope_theta, dict(ours.rope_scaling).get("type", "default"), ours.experts) == \
        (config.rope_parameters["rope_theta"], config.rope_parameters["rope_type"], config.num_local_experts)
    config.save_pretrained(tmp_path / "saved")
    theirs = get_model(str(tmp_path / "saved"))
    assert replace(ours, name="").to_dict() == replace(theirs, name="").to_dict()


def test_phi_details(tmp_path):
    """phi-2's block: one LayerNorm with bias for attention and MLP side by side, biases on every linear and on the
    output layer; rotary positions on 40 % of each head; Megatron-LM's arguments cannot express the head's bias
    (nor the parallel residual)."""
    from planner.targets.megatron_lm import megatron_model_args

    cfg, _ = PUBLISHED["phi-2"]
    model = get_model(str(_write(tmp_path, cfg)))
    assert model.parallel_residual and model.shared_norm and model.norm_bias and not model.rms_norm
    assert model.head_bias and model.mlp_bias and model.rotary_dim == 32 and model.activation == "gelu_tanh"
    head = model.num_layers - 1
    assert model.params(head, tp=2) == (51200 * 2560 + 51200) // 2 + 2 * 2560  # the final LayerNorm is in the head
    with pytest.raises(SailorError, match="a bias on the output layer"):
        megatron_model_args(replace(model, parallel_residual=False, shared_norm=False, rotary_fraction=1.0))
    for change, needle in (({"qk_layernorm": True}, "qk_layernorm .* is not supported for phi"),
                           ({"partial_rotary_factor": 0}, "partial_rotary_factor must be above 0"),
                           ({"tie_word_embeddings": True}, "a bias on the output layer .* tied")):
        with pytest.raises(SailorError, match=needle):
            get_model(str(_write(tmp_path, {**cfg, **change})))


_SMALL = {"hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
          "vocab_size": 300, "max_position_embeddings": 64}
_GRANITE_MOE = {**_SMALL, "model_type": "granitemoe", "num_key_value_heads": 2, "num_experts_per_tok": 2}


@pytest.mark.parametrize("cfg", [
    {**_GRANITE_MOE, "num_local_experts": 4, "sliding_window": 3},  # GraniteMoE has no windows: ignored
    {**_GRANITE_MOE, "num_experts": 4},  # not an alias of num_local_experts there: its default, 8
    {**_GRANITE_MOE, "num_local_experts": 4, "attention_multiplier": None},  # 1/sqrt(head_dim)
    {**_SMALL, "model_type": "granite", "sliding_window": 3},
    {**_SMALL, "model_type": "phi", "head_dim": 8, "partial_rotary_factor": 0.5},
    {**_SMALL, "model_type": "phi", "partial_rotary_factor": 0.4,
     "rope_scaling": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.75}},
    {**_SMALL, "model_type": "phi", "rope_scaling": {"type": "linear", "factor": 2.0},
     "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}},
    {**_SMALL, "model_type": "cohere", "head_dim": 8, "use_qk_norm": True},
], ids=["granitemoe-window", "granitemoe-num-experts", "granitemoe-null-scale", "granite-window", "phi-head-dim",
        "phi-rotary-in-scaling", "phi-scaling-wins", "cohere-head-dim"])
def test_config_reads_as_transformers_builds_the_model(cfg, tmp_path):
    """Fields that transformers reads, ignores or reads from another place (found by fuzzing): our model and
    transformers' model of the same config.json agree on the head width, the rotated dimensions, the experts,
    the attention scale and the windows."""
    transformers = pytest.importorskip("transformers")
    import torch

    ours = get_model(str(_write(tmp_path, cfg)))
    with torch.device("meta"):
        config = transformers.AutoConfig.for_model(**cfg)  # (5.24's auto classes lack Mistral 4's causal LM)
        live = transformers.Mistral4ForCausalLM(config) if cfg["model_type"] == "mistral4" else \
            transformers.AutoModelForCausalLM.from_config(config)
    attention = live.model.layers[0].self_attn
    assert ours.q_dim == attention.q_proj.out_features
    assert ours.rotary_dim == 2 * live.model.rotary_emb.inv_freq.numel()
    assert ours.attention_scale == (attention.scaling if attention.scaling != attention.head_dim ** -0.5 and
                                    attention.scaling is not None else 0.0)
    assert not ours.windows and getattr(live.config, "layer_types", None) is None
    if ours.experts:
        assert ours.experts == live.model.layers[0].block_sparse_moe.router.weight.shape[0]


def test_deepseek_v3_details(tmp_path):
    """DeepSeek-V3: latent attention (q and kv latents 1536 and 512 wide, heads of 128 + 64 rotated q/k dimensions
    and 128 v ones), its softmax scale from YaRN's mscale_all_dim, three dense blocks first, 8 of 256 experts in 8
    groups chosen from the best 4 by sigmoid scores, one shared expert: 37.6 B of its 671 B parameters active per
    token; its published config names FP8 weights (read on load). Kimi K2: 1 T, 32 B active, as its card gives
    them. Moonlight has no q latent. Megatron-LM's launch
    refuses it."""
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    published = {**_DEEPSEEK_V3, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                         "quant_method": "fp8", "weight_block_size": [128, 128]}}
    model = get_model(str(_write(tmp_path, published)), seq_len=4096)
    assert (model.kv_lora_rank, model.q_lora_rank, model.rope_head_dim, model.v_head_dim, model.head_dim) == \
        (512, 1536, 64, 128, 192)
    assert (model.q_dim, model.context_dim, model.rotary_dim, model.rotary_interleaved) == (24576, 16384, 64, True)
    assert model.attention_scale == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)
    assert model.dense_blocks == (0, 1, 2) and (model.dense_ffn, model.ffn_hidden, model.shared_expert_ffn) == \
        (18432, 2048, 2048) and not model.shared_expert_gated
    assert (model.experts, model.experts_per_token, model.expert_groups, model.expert_groups_per_token) == \
        (256, 8, 8, 4)
    assert model.router_sigmoid and model.expert_score_bias and model.expert_renorm and model.routed_scale == 2.5
    assert model.sparse_blocks == 58 and model.params(1, 8) < model.params(4, 8)
    total = model.total_params(padded=False)
    inactive = 58 * (256 - 8) * 3 * 7168 * 2048
    assert round(total / 1e9) == 671 and round((total - inactive) / 1e9) == 38  # (the card: 37 B activated)
    assert model.tp_degrees(8) == [1, 2, 4, 8]
    # the exported config reads back as the same model
    (tmp_path / "back").mkdir()
    back = get_model(str(_write(tmp_path / "back", to_hf_config(model))), seq_len=4096)
    assert replace(back, name="").to_dict() == replace(model, name="").to_dict()
    with pytest.raises(SailorError, match="latent attention, a sigmoid router or dense blocks .* not map onto "
                                          "Megatron-LM's arguments"):
        megatron_model_args(model)
    kimi = get_model(str(_write(tmp_path, PUBLISHED["Kimi-K2"][0])))
    total = kimi.total_params(padded=False)
    assert round(total / 1e12) == 1 and int((total - 60 * (384 - 8) * 3 * 7168 * 2048) / 1e9) == 32
    moonlight = get_model(str(_write(tmp_path, PUBLISHED["Moonlight-16B-A3B"][0])))
    assert moonlight.q_lora_rank == 0 and moonlight.attention_scale == 0 and moonlight.expert_groups == 1
    assert moonlight.shared_expert_ffn == 2 * 1408 and moonlight.dense_blocks == (0,)


@pytest.mark.parametrize("change, needle", [
    ({"quantization_config": {"quant_method": "awq"}}, "quantization 'awq' is not supported; give unquantized "
                                                        "weights or DeepSeek's own block-scaled FP8 ones"),
    ({"attention_bias": True}, "attention_bias is not supported for deepseek_v3; set it to false"),
    ({"output_router_logits": True}, "--moe-aux-loss-coeff"),
    ({"n_group": 7}, "256 experts in 7 groups"),
    ({"topk_group": 9}, "from 9 of them"),
    ({"num_experts_per_tok": 200}, "each token's 200 from 4 of them"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace must be a whole number >= 0, not -1"),
    ({"n_shared_experts": 1.5}, "n_shared_experts must be a whole number >= 0, not 1.5"),
    ({"qk_rope_head_dim": 7}, "rotary positions turn pairs of dimensions, and 7 of each head's 135"),
    ({"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer"),
    ({"routed_scaling_factor": -1}, "routed_scaling_factor must be a positive number"),
])
def test_bad_deepseek_config_is_one_clear_error(tmp_path, change, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**_DEEPSEEK_V3, **change})))


@pytest.mark.parametrize("change", [{}, {"q_lora_rank": None}, {"num_local_experts": 16, "n_routed_experts": None},
                                    {"rope_scaling": None, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                                               "mscale_all_dim": 0.7}},
                                    {"first_k_dense_replace": 0, "n_shared_experts": 0}],
                         ids=["as-published", "no-q-latent", "experts-alias", "linear-mscale", "no-dense-no-shared"])
def test_deepseek_reads_as_transformers_builds_the_model(change, tmp_path):
    """A small DeepSeek-V3 config and transformers' model of it agree on the q width, the softmax scale (scaled by
    mscale_all_dim under any scaled rope), the rotated dimensions, the experts, the groups, the shared expert's
    width and which blocks are dense."""
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = {**_DEEPSEEK_V3, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 16,
           "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 12,
           "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4, "first_k_dense_replace": 1, "vocab_size": 300,
           "max_position_embeddings": 4096 * 40, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None or k == "q_lora_rank"}
    ours = get_model(str(_write(tmp_path, cfg)))
    with torch.device("meta"):
        config = transformers.AutoConfig.for_model(**cfg)  # (5.24's auto classes lack Mistral 4's causal LM)
        live = transformers.Mistral4ForCausalLM(config) if cfg["model_type"] == "mistral4" else \
            transformers.AutoModelForCausalLM.from_config(config)
    attention = live.model.layers[0].self_attn
    q = attention.q_b_proj if attention.q_lora_rank is not None else attention.q_proj
    assert ours.q_dim == q.out_features and bool(ours.q_lora_rank) == (attention.q_lora_rank is not None)
    assert ours.rotary_dim == 2 * live.model.rotary_emb.inv_freq.numel()
    assert (ours.attention_scale or ours.head_dim ** -0.5) == pytest.approx(attention.scaling, rel=1e-12)
    dense = tuple(i for i, layer in enumerate(live.model.layers) if not hasattr(layer.mlp, "gate"))
    assert ours.dense_blocks == dense
    sparse = live.model.layers[-1].mlp
    assert (ours.experts, ours.expert_groups, ours.expert_groups_per_token, ours.experts_per_token) == \
        (sparse.gate.num_experts, sparse.gate.num_group, sparse.gate.topk_group, sparse.gate.top_k)
    assert ours.shared_expert_ffn == sparse.shared_experts.down_proj.in_features
    assert ours.total_params(padded=False) == transformers_count(cfg)


def test_deepseek_v2_details(tmp_path):
    """DeepSeek-V2: 236 B parameters, 21 B active (6 of 160 experts and 2 shared), as its card gives them; a softmax
    router choosing from the best 3 of 8 groups, weights unrenormalised and times 16; adjacent pairs rotated.
    V2-Lite (15.7 B) chooses greedily; topk methods its router does not run are refused."""
    model = get_model(str(_write(tmp_path, _DEEPSEEK_V2)))
    assert not model.router_sigmoid and not model.expert_score_bias and not model.expert_renorm
    assert (model.expert_groups, model.expert_groups_per_token, model.routed_scale) == (8, 3, 16.0)
    assert model.rotary_interleaved and model.dense_blocks == (0,) and model.shared_expert_ffn == 2 * 1536
    assert model.attention_scale == pytest.approx(192 ** -0.5 * (0.1 * 0.707 * math.log(40) + 1) ** 2)
    total = model.total_params(padded=False)
    assert round(total / 1e9) == 236 and round((total - 59 * (160 - 6) * 3 * 5120 * 1536) / 1e9) == 21
    lite = get_model(str(_write(tmp_path, PUBLISHED["DeepSeek-V2-Lite"][0])))
    assert lite.expert_groups == 1 and lite.q_lora_rank == 0
    total = lite.total_params(padded=False)
    # (its card gives 2.4 B active; counted here, 6 of 64 experts, the shared ones and the rest, 2.66 B)
    assert round(total / 1e9, 1) == 15.7 and round((total - 26 * (64 - 6) * 3 * 2048 * 1408) / 1e9, 2) == 2.66
    for change, needle in (({"topk_method": "noaux_tc"}, "topk_method 'noaux_tc' is not one deepseek_v2's router "
                                                         "runs; use greedy or group_limited_greedy"),
                           ({"n_group": None}, "missing field 'n_group'"),
                           ({"mlp_bias": True}, "mlp_bias is not supported for deepseek_v2")):
        with pytest.raises(SailorError, match=needle):
            get_model(str(_write(tmp_path, {**_DEEPSEEK_V2, **change})))


def test_ministral3_details(tmp_path):
    """Ministral 3: Mistral's blocks, YaRN, and q after rotary positions scaled by 1 + 0.1 ln(1 + floor(p / 16384))
    at position p. Within the original 16k context the factor is 1 and costs nothing; beyond it the planner counts
    the product. Megatron-LM cannot run it; the exported config reads back as the model."""
    from planner.profiles.layer_work import layer_work
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    short_run = get_model(str(_write(tmp_path, _MINISTRAL_3_8B)), seq_len=16384)
    long_run = replace(short_run, seq_len=32768)
    assert (short_run.query_scale_beta, short_run.query_scale_span, short_run.head_dim) == (0.1, 16384, 128)
    assert dict(short_run.rope_scaling)["factor"] == 16.0 and not short_run.query_scaled(0) and long_run.query_scaled(0)
    plain = replace(long_run, query_scale_beta=0.0)
    assert layer_work(long_run, 1, 1, 1, 2)[0].kernels == layer_work(plain, 1, 1, 1, 2)[0].kernels + 8
    assert layer_work(short_run, 1, 1, 1, 2) == layer_work(replace(short_run, query_scale_beta=0.0), 1, 1, 1, 2)
    with pytest.raises(SailorError, match="a query scale that grows with the position"):
        megatron_model_args(short_run)
    (tmp_path / "back").mkdir()
    back = get_model(str(_write(tmp_path / "back", to_hf_config(short_run))), seq_len=16384)
    assert replace(back, name="").to_dict() == replace(short_run, name="").to_dict()
    with pytest.raises(SailorError, match="a query scale that grows with the position is ministral3's alone"):
        to_hf_config(replace(short_run, hf_model_type="mistral"))


def test_minimax_m2_details(tmp_path):
    """MiniMax-M2: 10 B of its 229 B parameters active (8 of 256 experts; the embeddings left out), q and k
    normalised across all heads, half of each head rotated, DeepSeek-V3's router without groups or scale. The
    exported config reads back as the model; Megatron-LM refuses the router."""
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    model = get_model(str(_write(tmp_path, _MINIMAX_M2)))
    assert (model.rotary_dim, model.qk_norm_full, model.router_sigmoid, model.expert_score_bias) == \
        (64, True, True, True)
    assert model.expert_renorm and (model.expert_groups, model.routed_scale, model.shared_expert_ffn) == (1, 1.0, 0)
    inactive, embeddings = 62 * (256 - 8) * 3 * 3072 * 1536, 2 * 200064 * 3072
    assert round((model.total_params(padded=False) - inactive - embeddings) / 1e9) == 10
    (tmp_path / "back").mkdir()
    back = get_model(str(_write(tmp_path / "back", to_hf_config(model))))
    assert replace(back, name="").to_dict() == replace(model, name="").to_dict()
    with pytest.raises(SailorError, match="sigmoid router"):
        megatron_model_args(model)
    with pytest.raises(SailorError, match="router_jitter_noise is not supported"):
        get_model(str(_write(tmp_path, {**_MINIMAX_M2, "router_jitter_noise": 0.1})))


def test_ernie4_5_moe_details(tmp_path):
    """ERNIE-4.5-21B-A3B: 3 B of its 21.8 B parameters active (6 of 64 experts and 2 shared, the embedding
    once, tied), a dense first block, experts chosen by softmax plus a fixed bias. The exported config reads back
    as the model; experts on blocks that are not one run, or biases on the linears, are refused."""
    from planner.specs.families import to_hf_config

    model = get_model(str(_write(tmp_path, _ERNIE_MOE)))
    assert (model.experts, model.experts_per_token, model.dense_blocks, model.shared_expert_ffn) == (64, 6, (0,), 3072)
    assert model.expert_score_bias and not model.router_sigmoid and model.expert_renorm and model.rotary_interleaved
    inactive, embedding = 27 * (64 - 6) * 3 * 2560 * 1536, 103424 * 2560
    assert round((model.total_params(padded=False) - inactive - embedding) / 1e9) == 3
    (tmp_path / "back").mkdir()
    back = get_model(str(_write(tmp_path / "back", to_hf_config(model))))
    assert replace(back, name="").to_dict() == replace(model, name="").to_dict()
    interval = get_model(str(_write(tmp_path, {**_ERNIE_MOE, "moe_layer_interval": 2})))
    assert interval.dense_blocks == tuple(range(0, 28, 2))
    with pytest.raises(SailorError, match="ernie4_5_moe's config puts experts on one run of blocks"):
        to_hf_config(interval)
    with pytest.raises(SailorError, match="ernie4_5_moe's experts' linears have no biases; set use_bias to false"):
        get_model(str(_write(tmp_path, {**_ERNIE_MOE, "use_bias": True})))


def test_glm4_moe_lite_details(tmp_path):
    """glm4_moe_lite (GLM-4.7-Flash): DeepSeek-V3's latent attention and sigmoid router, 3 B active (4 of 64
    experts and the shared one; the embeddings left out), its dense blocks where mlp_layer_types says. The exported
    config reads back as the model."""
    from planner.specs.families import to_hf_config

    model = get_model(str(_write(tmp_path, _GLM_LITE)))
    assert (model.experts, model.experts_per_token, model.dense_blocks, model.norm_eps) == (64, 4, (0,), 1e-5)
    assert model.router_sigmoid and model.expert_score_bias and model.latent and model.routed_scale == 1.8
    inactive, embeddings = 46 * (64 - 4) * 3 * 2048 * 1536, 2 * 154880 * 2048
    assert round((model.total_params(padded=False) - inactive - embeddings) / 1e9) == 3
    types = ["sparse"] * 47
    types[5] = "dense"
    placed = get_model(str(_write(tmp_path, {**_GLM_LITE, "mlp_layer_types": types})))
    assert placed.dense_blocks == (5,)
    for spec in (model, placed):
        (tmp_path / "back").mkdir(exist_ok=True)
        back = get_model(str(_write(tmp_path / "back", to_hf_config(spec))))
        assert replace(back, name="").to_dict() == replace(spec, name="").to_dict()
    with pytest.raises(SailorError, match="mlp_layer_types must list dense or sparse for each of the 47 layers"):
        get_model(str(_write(tmp_path, {**_GLM_LITE, "mlp_layer_types": ["dense"]})))


def test_mistral4_details(tmp_path):
    """Mistral Small 4: DeepSeek's latent attention (adjacent pairs rotated, YaRN's softmax scale) and experts
    chosen by a softmax, 4 of 128, renormalised, with a shared one on every block; Ministral 3's query scale beyond
    8192 tokens. The exported config reads back as the model; expert groups are refused."""
    from planner.specs.families import to_hf_config

    model = get_model(str(_write(tmp_path, _MISTRAL_SMALL_4)), seq_len=4096)
    assert (model.experts, model.experts_per_token, model.expert_renorm, model.router_sigmoid) == (128, 4, True, False)
    assert (model.kv_lora_rank, model.q_lora_rank, model.rope_head_dim, model.dense_blocks) == (256, 1024, 64, ())
    assert (model.query_scale_beta, model.query_scale_span, model.rotary_interleaved) == (0.1, 8192, True)
    assert model.attention_scale == pytest.approx(128 ** -0.5 * (0.1 * math.log(128) + 1) ** 2)
    (tmp_path / "back").mkdir()
    back = get_model(str(_write(tmp_path / "back", to_hf_config(model))), seq_len=4096)
    assert replace(back, name="").to_dict() == replace(model, name="").to_dict()
    with pytest.raises(SailorError, match="mistral4's expert groups .* are not supported; use n_group 1"):
        get_model(str(_write(tmp_path, {**_MISTRAL_SMALL_4, "n_group": 4, "topk_group": 2})))


@pytest.mark.parametrize("rope, needle", [
    ({"rope_type": "default", "rope_theta": 1e6}, "rope llama_4_scaling_beta must be a number >= 0, not null"),
    ({"rope_type": "default", "llama_4_scaling_beta": -1}, "llama_4_scaling_beta must be a number >= 0, not -1"),
    ({"rope_type": "default", "llama_4_scaling_beta": 0.1}, "rope original_max_position_embeddings must be the "
                                                            "original context length"),
])
def test_bad_ministral3_config_is_one_clear_error(tmp_path, rope, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**_MINISTRAL_3_8B, "rope_parameters": rope})))


def test_llama4_details(tmp_path):
    """Llama 4: 17 B parameters active of Scout's 107.8 B and of Maverick's 400.7 B (one routed expert and the
    shared one per sparse block), every fourth block without rotary positions; on the others, L2 q/k norms (not
    Maverick's) and chunks of 8192 tokens, which the planner counts only where a sequence is longer; q scaled on the
    NoPE blocks from the 8192nd token on. Megatron-LM cannot run it; the exported configs read back as the models."""
    from planner.profiles.layer_work import layer_work
    from planner.specs.families import to_hf_config
    from planner.targets.megatron_lm import megatron_model_args

    scout = get_model(str(_write(tmp_path, _LLAMA4_SCOUT)), seq_len=8192)
    maverick = get_model(str(_write(tmp_path, _LLAMA4_MAVERICK)), seq_len=8192)
    assert (scout.experts, scout.experts_per_token, scout.dense_blocks, scout.shared_expert_ffn) == (16, 1, (), 8192)
    assert (maverick.experts, maverick.dense_blocks, maverick.dense_ffn) == (128, tuple(range(0, 48, 2)), 16384)
    assert scout.nope_blocks == tuple(range(3, 48, 4)) and scout.qk_l2_norm and not maverick.qk_l2_norm
    assert scout.rotary_interleaved and scout.expert_input_weighted and scout.router_sigmoid and not scout.expert_renorm
    for model, sparse in ((scout, 48), (maverick, 24)):
        inactive = sparse * (model.experts - 1) * 3 * 5120 * 8192
        assert round((model.total_params(padded=False) - inactive) / 1e9) == 17
    # at 8192 tokens: no chunk cuts, and the factor reaches the last token of the NoPE blocks alone
    assert scout.chunk(0) == 0 and scout.query_scaled(3) and not scout.query_scaled(0)
    assert not replace(scout, seq_len=8191).query_scaled(3)
    longer = replace(scout, seq_len=16384)
    assert longer.chunk(0) == 8192 and longer.chunk(3) == 0
    causal, chunked = (layer_work(model, 1, 1, 1, 2, "sdpa")[0] for model in (replace(longer, attention_chunk=0),
                                                                              longer))
    assert chunked.gemm_flops > causal.gemm_flops  # (a masked square, not a causal kernel's half of it)
    with pytest.raises(SailorError, match="a sigmoid router .* which sailor does not map onto Megatron-LM"):
        megatron_model_args(scout)
    llama3 = get_model(str(_write(tmp_path, PUBLISHED["Llama-3-8B"][0])))
    mixtral = get_model(str(_write(tmp_path, PUBLISHED["Mixtral-8x7B"][0])))
    for model, what in ((replace(llama3, attention_chunk=8192), "chunked attention"),
                        (replace(llama3, qk_l2_norm=True), "q/k norms without weights"),
                        (replace(mixtral, expert_input_weighted=True), "experts whose input is weighted")):
        with pytest.raises(SailorError, match=what):
            megatron_model_args(model)
    for model in (scout, maverick):
        (tmp_path / "back").mkdir(exist_ok=True)
        back = get_model(str(_write(tmp_path / "back", to_hf_config(model))), seq_len=8192)
        assert replace(back, name="").to_dict() == replace(model, name="").to_dict()


@pytest.mark.parametrize("change, needle", [
    ({"layer_types": ["full_attention"] * 48}, "layer_types must put chunked attention on the blocks with rotary "
                                              "positions"),
    ({"moe_layers": [48]}, "moe_layers must list block indices from 0 to 47, not \\[48\\]"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers must list 1 .* or 0 .* for each of the 48 layers"),
    ({"output_router_logits": True}, "output_router_logits adds a load-balancing loss"),
])
def test_bad_llama4_config_is_one_clear_error(tmp_path, change, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**_LLAMA4_SCOUT, **change})))


def test_glm4_moe_details(tmp_path):
    """GLM-4.5-Air: q/k/v biases and none on the output projection, the first 64 of each head's 128 dimensions
    rotated by halves, DeepSeek-V3's router and a dense first block; 12 B of its 106 B parameters active, the
    embeddings left out, as its card counts them. GLM-4.5 adds per-head q/k norms (32 B active; 352.8 B here,
    its card's 355 B counting the multi-token prediction layer). The exported config reads back as the model."""
    from planner.specs.families import to_hf_config

    air = get_model(str(_write(tmp_path, _GLM45_AIR)))
    assert air.qkv_bias and not air.out_bias and not air.qk_norm and not air.rotary_interleaved
    assert (air.rotary_dim, air.num_query_groups, air.dense_blocks, air.experts, air.expert_groups) == \
        (64, 8, (0,), 128, 1)
    assert air.router_sigmoid and air.expert_score_bias and air.shared_expert_ffn == 1408
    embeddings = 2 * 151552 * 4096
    inactive = 45 * (128 - 8) * 3 * 4096 * 1408
    assert round((air.total_params(padded=False) - inactive - embeddings) / 1e9) == 12
    full = get_model(str(_write(tmp_path, PUBLISHED["GLM-4.5"][0])))
    assert full.qk_norm and full.dense_blocks == (0, 1, 2) and full.routed_scale == 2.5
    inactive, embeddings = 89 * (160 - 8) * 3 * 5120 * 1536, 2 * 151552 * 5120
    assert round((full.total_params(padded=False) - inactive - embeddings) / 1e9) == 32
    for model in (air, full):
        (tmp_path / "back").mkdir(exist_ok=True)
        back = get_model(str(_write(tmp_path / "back", to_hf_config(model))))
        assert replace(back, name="").to_dict() == replace(model, name="").to_dict()
    with pytest.raises(SailorError, match="quantization 'gptq' is not supported"):
        get_model(str(_write(tmp_path, {**_GLM45_AIR, "quantization_config": {"quant_method": "gptq"}})))
    # (transformers' glm4_moe reads no window: every block attends to every token)
    assert get_model(str(_write(tmp_path, {**_GLM45_AIR, "sliding_window": 8, "layer_types": [
        "sliding_attention"] * 46}))).windows == ()


@pytest.mark.parametrize("change, needle", [
    ({"linear_num_value_heads": 20}, "20 linear-attention value heads are not divisible by its 16 key heads"),
    ({"linear_num_key_heads": 0}, "linear_num_key_heads must be a positive integer, not 0"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types must list linear_attention or full_attention for each of "
                                                "the 64 layers"),
    ({"full_attention_interval": 0.5}, "full_attention_interval must be a positive integer"),
    ({"sliding_window": 4096}, "qwen3_5_text's attention has no sliding window; remove sliding_window"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.5}},
     "partial_rotary_factor must be above 0 and at most 1, not 1.5"),
])
def test_bad_qwen3_5_config_is_one_clear_error(tmp_path, change, needle):
    with pytest.raises(SailorError, match=needle):
        get_model(str(_write(tmp_path, {**_QWEN3_5_27B, **change})))


def test_qwen3_next_dense_blocks(tmp_path):
    """Qwen3-Next's blocks without experts (mlp_only_layers, or off decoder_sparse_step) have a dense MLP
    intermediate_size wide, as transformers builds them; a malformed list is one line."""
    cfg = {**PUBLISHED["Qwen3-Next-80B-A3B"][0], "num_hidden_layers": 8, "mlp_only_layers": [0],
           "decoder_sparse_step": 2, "intermediate_size": 1024}
    model = get_model(str(_write(tmp_path, cfg)))
    assert model.dense_blocks == (0, 2, 4, 6) and model.dense_ffn == 1024
    assert model.total_params(padded=False) == transformers_count(cfg)
    dense = get_model(str(_write(tmp_path, {**cfg, "num_experts": 0})))
    assert not dense.experts and dense.ffn_hidden == 1024
    assert dense.total_params(padded=False) == transformers_count({**cfg, "num_experts": 0})
    with pytest.raises(SailorError, match="mlp_only_layers must list block indices from 0 to 7"):
        get_model(str(_write(tmp_path, {**cfg, "mlp_only_layers": [9]})))


def test_qwen3_5_plans_tp_by_its_linear_key_heads_and_refuses_megatron_lm(tmp_path):
    """TP splits Gated DeltaNet's key heads whole (16 in Qwen3.5-27B); with 2 key heads TP 4 is not offered.
    Megatron-LM's launch refuses the model in one line."""
    from planner.targets.megatron_lm import megatron_model_args

    assert get_model(str(_write(tmp_path, _QWEN3_5_27B))).tp_degrees(8) == [1, 2, 4]  # (4 query groups)
    narrow = get_model(str(_write(tmp_path, {**_QWEN3_5_27B, "num_key_value_heads": 8, "linear_num_key_heads": 2,
                                             "linear_num_value_heads": 6})))
    assert narrow.tp_degrees(8) == [1, 2]
    with pytest.raises(SailorError, match="Gated DeltaNet .* which stock Megatron-LM's arguments cannot express"):
        megatron_model_args(narrow)
