"""ModelConfig: the Qwen3.5-family text-tower geometry, normalised once from an HF config dict.

Accepts both shapes the checkpoints come in:

* a text config (``model_type`` ``qwen3_5_text`` / ``qwen3_5_moe_text``), as written by
  ``Qwen3_5ForCausalLM.save_pretrained``;
* the composite ConditionalGeneration config (``model_type`` ``qwen3_5`` / ``qwen3_5_moe``) of the real
  checkpoints, whose text tower sits under ``text_config``.

RoPE settings are read from ``rope_parameters`` (transformers 5) or from the older top-level
``rope_theta`` / ``partial_rotary_factor`` / ``rope_scaling`` fields. Owns no runtime state:
discovered values (page counts, eos ids from the tokenizer) live elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

TEXT_MODEL_TYPES = {"qwen3_5_text": False, "qwen3_5_moe_text": True}
COMPOSITE_MODEL_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # the text tower's: qwen3_5_text | qwen3_5_moe_text
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    mrope_section: tuple[int, ...] | None
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    tie_word_embeddings: bool = False
    intermediate_size: int | None = None  # dense MLP width (dense model only)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    mtp_num_hidden_layers: int = 1
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str | None = None  # the checkpoint's declared dtype, e.g. "bfloat16"

    def __post_init__(self) -> None:
        _check(
            self.model_type in TEXT_MODEL_TYPES,
            "model_type",
            self.model_type,
            f"one of {sorted(TEXT_MODEL_TYPES)}",
        )
        for name in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
            "linear_num_key_heads", "linear_num_value_heads",
        ):  # fmt: skip
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name, value, "a positive integer")
        _check(len(self.layer_types) == self.num_hidden_layers, "layer_types", self.layer_types,
               f"{self.num_hidden_layers} entries (num_hidden_layers)")  # fmt: skip
        bad = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        _check(not bad, "layer_types", bad, f"only {LAYER_TYPES}")
        _check(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
               self.num_key_value_heads, f"a divisor of num_attention_heads={self.num_attention_heads}")  # fmt: skip
        _check(self.linear_num_value_heads % self.linear_num_key_heads == 0, "linear_num_value_heads",
               self.linear_num_value_heads, f"a multiple of linear_num_key_heads={self.linear_num_key_heads}")  # fmt: skip
        _check(
            0.0 < self.partial_rotary_factor <= 1.0,
            "partial_rotary_factor",
            self.partial_rotary_factor,
            "in (0, 1]",
        )
        _check(self.rotary_dim % 2 == 0 and self.rotary_dim > 0, "partial_rotary_factor", self.partial_rotary_factor,
               f"a factor giving an even rotary dim of head_dim={self.head_dim}")  # fmt: skip
        if self.mrope_section is not None:
            _check(len(self.mrope_section) == 3 and sum(self.mrope_section) <= self.rotary_dim // 2,
                   "mrope_section", self.mrope_section, f"3 sections summing to <= {self.rotary_dim // 2}")  # fmt: skip
        _check(self.rms_norm_eps > 0, "rms_norm_eps", self.rms_norm_eps, "> 0")
        _check(self.rope_theta > 0, "rope_theta", self.rope_theta, "> 0")
        _check(self.mtp_num_hidden_layers >= 0, "mtp_num_hidden_layers", self.mtp_num_hidden_layers, ">= 0")
        if self.is_moe:
            for name in (
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
            ):
                _check(
                    getattr(self, name) > 0, name, getattr(self, name), "a positive integer for a MoE model"
                )
            _check(self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok", self.num_experts_per_tok,
                   f"<= num_experts={self.num_experts}")  # fmt: skip
        else:
            value = self.intermediate_size
            _check(
                isinstance(value, int) and value > 0,
                "intermediate_size",
                value,
                "a positive integer for a dense model",
            )

    # ---- derived values -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return TEXT_MODEL_TYPES[self.model_type]

    @property
    def architecture(self) -> str:
        return "Qwen3_5MoeForCausalLM" if self.is_moe else "Qwen3_5ForCausalLM"

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @cached_property
    def attention_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @cached_property
    def linear_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def num_attention_layers(self) -> int:
        return len(self.attention_layer_ids)

    @property
    def num_linear_layers(self) -> int:
        return len(self.linear_layer_ids)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN short convolution: q, k and v concatenated."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """Normalise an HF ``config.json`` dict (text or composite ConditionalGeneration config)."""
        if not isinstance(config, dict):
            raise ValueError(f"config: expected a dict, got {type(config).__name__}")
        text = _text_section(config)
        rope = _rope_settings(text)
        is_moe = TEXT_MODEL_TYPES[text["model_type"]]
        num_layers = _required(text, "num_hidden_layers")
        # NOTE: a JSON value; annotated because mypy resolves these nested `dict.get`s to `Any | None`.
        mtp_layers: Any = text.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers", 1))
        values: dict[str, Any] = {
            "model_type": text["model_type"],
            "layer_types": _layer_types(text, num_layers),
            "tie_word_embeddings": bool(
                text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
            ),
            "eos_token_ids": _int_tuple(text.get("eos_token_id", config.get("eos_token_id"))),
            "bos_token_id": text.get("bos_token_id", config.get("bos_token_id")),
            "dtype": text.get("dtype")
            or text.get("torch_dtype")
            or config.get("dtype")
            or config.get("torch_dtype"),
            "mtp_num_hidden_layers": int(mtp_layers),
            **rope,
        }
        required = [
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        ]  # fmt: skip
        for name in required:
            values[name] = _required(text, name)
        values["head_dim"] = text.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
        values["rms_norm_eps"] = float(text.get("rms_norm_eps", 1e-6))
        values["linear_conv_kernel_dim"] = text.get("linear_conv_kernel_dim", 4)
        values["max_position_embeddings"] = text.get("max_position_embeddings", 32768)
        if is_moe:
            for name in (
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
            ):
                values[name] = _required(text, name)
        else:
            values["intermediate_size"] = _required(text, "intermediate_size")
        _check_unsupported(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def _check(ok: bool, field: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"ModelConfig.{field}={value!r}: expected {expected}")


def _required(section: dict[str, Any], name: str) -> Any:
    if name not in section or section[name] is None:
        raise ValueError(f"HF config: required field {name!r} is missing")
    return section[name]


def _text_section(config: dict[str, Any]) -> dict[str, Any]:
    model_type = config.get("model_type")
    if model_type in COMPOSITE_MODEL_TYPES:
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"HF config: model_type={model_type!r} needs a 'text_config' dict")
        text = dict(text)
        text.setdefault("model_type", COMPOSITE_MODEL_TYPES[model_type])
        if text["model_type"] != COMPOSITE_MODEL_TYPES[model_type]:
            raise ValueError(
                f"HF config: text_config.model_type={text['model_type']!r} does not belong to {model_type!r}"
            )
        return text
    if model_type in TEXT_MODEL_TYPES:
        return config
    expected = sorted([*TEXT_MODEL_TYPES, *COMPOSITE_MODEL_TYPES])
    raise ValueError(
        f"HF config: model_type={model_type!r} is not a Qwen3.5-family model (expected one of {expected})"
    )


def _layer_types(text: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    layer_types = text.get("layer_types")
    if layer_types is not None:
        return tuple(layer_types)
    interval = int(text.get("full_attention_interval", 4))
    if interval < 1:
        raise ValueError(f"HF config: full_attention_interval={interval!r}: expected >= 1")
    return tuple(
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
    )


def _rope_settings(text: dict[str, Any]) -> dict[str, Any]:
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ValueError(
            f"HF config: rope_parameters.rope_type={rope_type!r}: only 'default' RoPE is supported"
        )
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    section = params.get("mrope_section")
    interleaved = params.get("mrope_interleaved", True)
    if section is not None and not interleaved:
        raise ValueError(
            "HF config: rope_parameters.mrope_interleaved=False is not supported (Qwen3.5 interleaves)"
        )
    return {
        "rope_theta": float(theta),
        "partial_rotary_factor": float(factor),
        "mrope_section": tuple(section) if section is not None else None,
    }


def _check_unsupported(text: dict[str, Any]) -> None:
    if text.get("attention_bias"):
        raise ValueError("HF config: attention_bias=True is not supported (Qwen3.5 attention has no bias)")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"HF config: hidden_act={act!r}: only 'silu' is supported")


def _int_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
