"""Weight inventory: the tensor names and shapes a ModelConfig implies, and the strict name check.

Names are the HF checkpoint's (text tower): ``model.embed_tokens.weight``, ``model.layers.N.*``,
``model.norm.weight``, ``lm_head.weight`` (absent when embeddings are tied) and, for the MTP head,
``mtp.*``. MoE experts use the fused layout of the real checkpoints
(``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``).

Normalisation of source names (``normalize_name`` / ``collect_weights``):

* ``model.language_model.X`` (composite multimodal checkpoints) -> ``model.X``;
* ``model.visual.*`` (vision tower) is skipped: the text model does not use it;
* ``mtp.*`` is taken only when MTP is asked for, and skipped otherwise;
* per-expert tensors ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (what ``save_pretrained`` of
  transformers 5 writes for the tiny MoE models) are stacked into the fused layout; this is the one
  case where loading copies.

Anything else that is missing, unexpected or of the wrong shape raises ``WeightInventoryError``
listing every offending name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch

from engine.model.config import ModelConfig

Shape = tuple[int, ...]
_PER_EXPERT = re.compile(
    r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)
_MAX_LISTED = 20


class WeightInventoryError(ValueError):
    """The checkpoint's tensors do not match what the config implies."""


def _attention_weights(prefix: str, c: ModelConfig) -> dict[str, Shape]:
    h, d = c.hidden_size, c.head_dim
    return {
        f"{prefix}.self_attn.q_proj.weight": (2 * c.num_attention_heads * d, h),
        f"{prefix}.self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
        f"{prefix}.self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
        f"{prefix}.self_attn.o_proj.weight": (h, c.num_attention_heads * d),
        f"{prefix}.self_attn.q_norm.weight": (d,),
        f"{prefix}.self_attn.k_norm.weight": (d,),
    }


def _gdn_weights(prefix: str, c: ModelConfig) -> dict[str, Shape]:
    h, p = c.hidden_size, f"{prefix}.linear_attn"
    return {
        f"{p}.in_proj_qkv.weight": (c.conv_dim, h),
        f"{p}.in_proj_z.weight": (c.linear_value_dim, h),
        f"{p}.in_proj_b.weight": (c.linear_num_value_heads, h),
        f"{p}.in_proj_a.weight": (c.linear_num_value_heads, h),
        f"{p}.conv1d.weight": (c.conv_dim, 1, c.linear_conv_kernel_dim),
        f"{p}.dt_bias": (c.linear_num_value_heads,),
        f"{p}.A_log": (c.linear_num_value_heads,),
        f"{p}.norm.weight": (c.linear_value_head_dim,),
        f"{p}.out_proj.weight": (h, c.linear_value_dim),
    }


def _mlp_weights(prefix: str, hidden: int, intermediate: int) -> dict[str, Shape]:
    return {
        f"{prefix}.gate_proj.weight": (intermediate, hidden),
        f"{prefix}.up_proj.weight": (intermediate, hidden),
        f"{prefix}.down_proj.weight": (hidden, intermediate),
    }


def _feed_forward_weights(prefix: str, c: ModelConfig) -> dict[str, Shape]:
    h = c.hidden_size
    if not c.is_moe:
        assert c.intermediate_size is not None
        return _mlp_weights(f"{prefix}.mlp", h, c.intermediate_size)
    e, i = c.num_experts, c.moe_intermediate_size
    return {
        f"{prefix}.mlp.gate.weight": (e, h),
        f"{prefix}.mlp.experts.gate_up_proj": (e, 2 * i, h),
        f"{prefix}.mlp.experts.down_proj": (e, h, i),
        **_mlp_weights(f"{prefix}.mlp.shared_expert", h, c.shared_expert_intermediate_size),
        f"{prefix}.mlp.shared_expert_gate.weight": (1, h),
    }


def _layer_weights(prefix: str, c: ModelConfig, layer_type: str) -> dict[str, Shape]:
    mixer = _gdn_weights(prefix, c) if layer_type == "linear_attention" else _attention_weights(prefix, c)
    return {
        f"{prefix}.input_layernorm.weight": (c.hidden_size,),
        **mixer,
        **_feed_forward_weights(prefix, c),
        f"{prefix}.post_attention_layernorm.weight": (c.hidden_size,),
    }


def expected_weights(config: ModelConfig, with_mtp: bool = False) -> dict[str, Shape]:
    """Every tensor name -> shape the model needs, in a stable order (base model, then ``mtp.*``)."""
    c = config
    names: dict[str, Shape] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for layer_id, layer_type in enumerate(c.layer_types):
        names.update(_layer_weights(f"model.layers.{layer_id}", c, layer_type))
    names["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        names["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    if with_mtp:
        names.update(expected_mtp_weights(c))
    return names


def expected_mtp_weights(config: ModelConfig) -> dict[str, Shape]:
    """The ``mtp.*`` tensors alone (embedding and lm_head are shared with the base model)."""
    c, h = config, config.hidden_size
    if c.mtp_num_hidden_layers < 1:
        raise ValueError(
            f"ModelConfig.mtp_num_hidden_layers={c.mtp_num_hidden_layers}: this model has no MTP head"
        )
    names: dict[str, Shape] = {
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.fc.weight": (h, 2 * h),
    }
    for i in range(c.mtp_num_hidden_layers):
        names.update(_layer_weights(f"mtp.layers.{i}", c, "full_attention"))
    names["mtp.norm.weight"] = (h,)
    return names


def normalize_name(name: str) -> str:
    """Checkpoint name -> model name (``model.language_model.`` -> ``model.``)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    return name


def is_skipped(name: str, config: ModelConfig, with_mtp: bool) -> bool:
    """Tensors present in real checkpoints that this text model deliberately does not load."""
    if name.startswith(("model.visual.", "visual.", "text/draft_head")):  # the draft head: engine/spec
        return True
    if name.startswith("mtp.") and not with_mtp:
        return True
    return name == "lm_head.weight" and config.tie_word_embeddings


def _fuse_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stack per-expert ``experts.{e}.*_proj.weight`` into ``experts.gate_up_proj`` / ``experts.down_proj``."""
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        match = _PER_EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        groups.setdefault(match["prefix"], {}).setdefault(match["proj"], {})[int(match["expert"])] = tensor
    for prefix, projs in groups.items():
        counts = {proj: sorted(experts) for proj, experts in projs.items()}
        first = next(iter(counts.values()))
        if (
            set(counts) != {"gate_proj", "up_proj", "down_proj"}
            or any(v != first for v in counts.values())
            or (first != list(range(len(first))))
        ):
            raise WeightInventoryError(f"{prefix}: incomplete per-expert tensors {counts}")
        gate = torch.stack([projs["gate_proj"][e] for e in first])
        up = torch.stack([projs["up_proj"][e] for e in first])
        out[f"{prefix}.gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[f"{prefix}.down_proj"] = torch.stack([projs["down_proj"][e] for e in first])
    return out


def check_inventory(shapes: dict[str, Shape], config: ModelConfig, with_mtp: bool = False) -> None:
    """Raise WeightInventoryError unless ``shapes`` (model names) is exactly the expected set."""
    expected = expected_weights(config, with_mtp)
    missing = [n for n in expected if n not in shapes]
    unexpected = sorted(n for n in shapes if n not in expected)
    wrong = [f"{n}: {tuple(shapes[n])} (expected {expected[n]})" for n in expected if n in shapes and tuple(shapes[n]) != expected[n]]  # fmt: skip
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
        if items:
            listed = ", ".join(items[:_MAX_LISTED]) + (
                f", ... ({len(items)} in all)" if len(items) > _MAX_LISTED else ""
            )
            problems.append(f"{len(items)} {label}: {listed}")
    if problems:
        raise WeightInventoryError(
            f"weights do not match {config.architecture} config: " + "; ".join(problems)
        )


def collect_weights(
    names: Iterable[str],
    get_tensor: Callable[[str], torch.Tensor],
    config: ModelConfig,
    with_mtp: bool = False,
) -> dict[str, torch.Tensor]:
    """Model name -> tensor for every needed weight, after normalisation and the strict inventory check.

    ``get_tensor`` is called once per kept name; its tensors are passed through untouched (no copy)
    except per-expert MoE tensors, which are stacked.
    """
    tensors: dict[str, torch.Tensor] = {}
    for source in names:
        name = normalize_name(source)
        if is_skipped(name, config, with_mtp):
            continue
        if name in tensors:
            raise WeightInventoryError(f"{name}: given twice (source name {source!r})")
        tensors[name] = get_tensor(source)
    tensors = _fuse_experts(tensors)
    check_inventory({n: tuple(t.shape) for n, t in tensors.items()}, config, with_mtp)
    return tensors
