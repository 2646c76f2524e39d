"""Where each profile object's values come from in a Hugging Face Qwen3.5 checkpoint (the converter's recipe).

``source_tensor(spec, get, config)`` returns the logical tensor an object stores, built from the checkpoint's
tensors (``get(name)``, model names as ``engine.model.weights.normalize_name`` gives them): fused parents are
the row concatenation of their outputs in order; the attention query and output gate are split out of HF's
per-head ``[query | gate]`` interleaved ``q_proj`` (a first-half/second-half split would be wrong); GDN
query/key/value are row ranges of ``in_proj_qkv``; the conv taps are stored tap-major ``[K, C]``; routed
experts are the fused banks reshaped expert-major. Vision objects (``vision/*``) map one to one onto the tower's
``model.visual.*`` tensors (``vision_parameter``; the patch embedding's Conv3d weight is stored as its
``[width, C * T * P * P]`` matrix). Draft-head and DFlash objects have no source in a checkpoint (the converter
writes development inventories without them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.artifact.profiles.spec import TensorSpec
from engine.model.config import ModelConfig

Get = Callable[[str], torch.Tensor]


def _attention_rows(prefix: str, get: Get, c: ModelConfig) -> dict[str, torch.Tensor]:
    q = get(prefix + "self_attn.q_proj.weight").view(c.num_attention_heads, 2, c.head_dim, -1)
    return {
        "query": q[:, 0].reshape(c.num_attention_heads * c.head_dim, -1),
        "gate": q[:, 1].reshape(c.num_attention_heads * c.head_dim, -1),
        "key": get(prefix + "self_attn.k_proj.weight"),
        "value": get(prefix + "self_attn.v_proj.weight"),
    }


def _gdn_rows(prefix: str, get: Get, c: ModelConfig) -> dict[str, torch.Tensor]:
    p = prefix + "linear_attn."
    query, key, value = get(p + "in_proj_qkv.weight").split(
        [c.linear_key_dim, c.linear_key_dim, c.linear_value_dim]
    )
    return {"query": query, "key": key, "value": value, "z": get(p + "in_proj_z.weight"),
            "a": get(p + "in_proj_a.weight"), "b": get(p + "in_proj_b.weight")}  # fmt: skip


def _layer_tensor(prefix: str, role: str, spec: TensorSpec, get: Get, c: ModelConfig) -> torch.Tensor:
    group, _, leaf = role.rpartition("/")
    plain = {
        "input_norm": "input_layernorm.weight", "post_attention_norm": "post_attention_layernorm.weight",
        "attention/query_norm": "self_attn.q_norm.weight", "attention/key_norm": "self_attn.k_norm.weight",
        "attention/output": "self_attn.o_proj.weight", "gdn/a_log": "linear_attn.A_log",
        "gdn/dt_bias": "linear_attn.dt_bias", "gdn/norm": "linear_attn.norm.weight",
        "gdn/output": "linear_attn.out_proj.weight", "mlp/down": "mlp.down_proj.weight",
        "moe/shared_down": "mlp.shared_expert.down_proj.weight",
    }  # fmt: skip
    if role in plain:
        return get(prefix + plain[role])
    if role == "gdn/convolution":
        return get(prefix + "linear_attn.conv1d.weight")[:, 0, :].t().contiguous()
    if role == "mlp/gate_up":
        return torch.cat([get(prefix + "mlp.gate_proj.weight"), get(prefix + "mlp.up_proj.weight")])
    if role == "moe/shared_gate_up":
        s = prefix + "mlp.shared_expert."
        return torch.cat([get(s + "gate_proj.weight"), get(s + "up_proj.weight")])
    if role == "moe/router_shared_gate":
        return torch.cat([get(prefix + "mlp.gate.weight"), get(prefix + "mlp.shared_expert_gate.weight")])
    if role == "moe/routed_gate_up":
        return get(prefix + "mlp.experts.gate_up_proj").reshape(-1, c.hidden_size)
    if role == "moe/routed_down":
        return get(prefix + "mlp.experts.down_proj").reshape(-1, c.moe_intermediate_size)
    if group in ("attention", "gdn") and spec.outputs:
        rows = (_attention_rows if group == "attention" else _gdn_rows)(prefix, get, c)
        return torch.cat([rows[name] for name, _ in spec.outputs])
    raise KeyError(f"{spec.name}: no source in a Hugging Face text checkpoint")


def source_tensor(spec: TensorSpec, get: Get, config: ModelConfig) -> torch.Tensor:
    """The logical value of ``spec`` (its stored shape) from the checkpoint; KeyError when it has none."""
    name = spec.name
    globals_ = {
        "text/token_embedding": "model.embed_tokens.weight", "text/final_norm": "model.norm.weight",
        "text/output_head": "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight",
        "mtp/input_projection": "mtp.fc.weight", "mtp/embedding_norm": "mtp.pre_fc_norm_embedding.weight",
        "mtp/hidden_norm": "mtp.pre_fc_norm_hidden.weight", "mtp/final_norm": "mtp.norm.weight",
    }  # fmt: skip
    if name in globals_:
        value = get(globals_[name])
    elif name.startswith("text/layers/"):
        _, _, index, role = name.split("/", 3)
        value = _layer_tensor(f"model.layers.{index}.", role, spec, get, config)
    elif name.startswith("mtp/layer/"):
        value = _layer_tensor("mtp.layers.0.", name[len("mtp/layer/") :], spec, get, config)
    else:
        raise KeyError(f"{name}: no source in a Hugging Face text checkpoint")
    if tuple(value.shape) != spec.shape:
        raise ValueError(
            f"{name}: the checkpoint gives {tuple(value.shape)}, the profile stores {spec.shape}"
        )
    return value


_VISION_GLOBALS = {
    "vision/patch_embedding": "patch_embed.proj.weight", "vision/patch_embedding_bias": "patch_embed.proj.bias",
    "vision/position_embedding": "pos_embed.weight",
    "vision/merger/fc1": "merger.linear_fc1.weight", "vision/merger/fc1_bias": "merger.linear_fc1.bias",
    "vision/merger/fc2": "merger.linear_fc2.weight", "vision/merger/fc2_bias": "merger.linear_fc2.bias",
    "vision/merger/norm/weight": "merger.norm.weight", "vision/merger/norm/bias": "merger.norm.bias",
}  # fmt: skip
_VISION_BLOCK = {
    "attention/qkv": "attn.qkv.weight", "attention/qkv_bias": "attn.qkv.bias",
    "attention/output": "attn.proj.weight", "attention/output_bias": "attn.proj.bias",
    "mlp/fc1": "mlp.linear_fc1.weight", "mlp/fc1_bias": "mlp.linear_fc1.bias",
    "mlp/fc2": "mlp.linear_fc2.weight", "mlp/fc2_bias": "mlp.linear_fc2.bias",
    "norm1/weight": "norm1.weight", "norm1/bias": "norm1.bias", "norm2/weight": "norm2.weight",
    "norm2/bias": "norm2.bias",
}  # fmt: skip


def vision_parameter(name: str) -> str:
    """The tower parameter (``engine.model.vision.VisionTower`` state-dict name, the checkpoint's ``model.visual.``
    name without the prefix) a ``vision/*`` object stores; KeyError for a name the layout does not have."""
    if name in _VISION_GLOBALS:
        return _VISION_GLOBALS[name]
    if name.startswith("vision/layers/"):
        _, _, index, role = name.split("/", 3)
        if role in _VISION_BLOCK and index.isdigit():
            return f"blocks.{index}.{_VISION_BLOCK[role]}"
    raise KeyError(f"{name}: not a vision tower object")


def vision_tensor(spec: TensorSpec, get: Get) -> torch.Tensor:
    """The logical value of a ``vision/*`` object from the tower's tensors (``get(parameter name)``, names as
    ``vision_parameter`` gives them); ValueError when its size disagrees with the profile's."""
    value = get(vision_parameter(spec.name))
    if value.numel() != torch.Size(spec.shape).numel() or (
        value.dim() == 2 and tuple(value.shape) != spec.shape
    ):
        raise ValueError(
            f"{spec.name}: the checkpoint gives {tuple(value.shape)}, the profile stores {spec.shape}"
        )
    return value.reshape(spec.shape)


def hf_tensors(
    values: dict[str, torch.Tensor],
    specs: list[TensorSpec],
    hf_shapes: dict[str, tuple[int, ...]],
    config: ModelConfig,
) -> dict[str, torch.Tensor]:
    """The inverse of ``source_tensor``: checkpoint tensors (float32, model names, ``hf_shapes``) rebuilt from
    the objects' values (``values[spec.name]``, e.g. dequantized payloads), e.g. to load the exact weights an
    artifact represents into the HF reference model.

    It runs ``source_tensor`` on index tensors (every checkpoint element numbered, in float64) to learn where
    each stored element comes from, then scatters the stored values back. Elements no object covers stay NaN.
    """
    offsets, start = {}, 0
    for name, shape in hf_shapes.items():
        offsets[name] = start
        start += int(torch.Size(shape).numel())
    flat = torch.full((start,), float("nan"), dtype=torch.float32)

    def index(name: str) -> torch.Tensor:
        numel = int(torch.Size(hf_shapes[name]).numel())
        return torch.arange(offsets[name], offsets[name] + numel, dtype=torch.float64).view(hf_shapes[name])

    for spec in specs:
        if spec.name in values:
            where = source_tensor(spec, index, config).reshape(-1).long()
            flat[where] = values[spec.name].reshape(-1).float()
    return {
        name: flat[offsets[name] : offsets[name] + int(torch.Size(s).numel())].view(s)
        for name, s in hf_shapes.items()
    }
