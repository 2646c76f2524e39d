"""The inventories of the published Qwen3.5-family weight profiles, as functions of the model geometry.

Each builder lists every stored object in writer order: the six frontend resources, the text tower (embedding,
layers in order, final norm, head), the optimized draft head, the MTP block, the vision tower, and (35B-A3B) the
DFlash drafter. Fused parents carry their logical row ranges (``outputs``), in the upstream artifacts' row
order (query/key/gate/value after splitting HF's per-head [query | gate] interleave; GDN
query/key/value/z; MLP gate then up; routed experts expert-major, each [gate 512 | up 512]).

Per-role allocation (what the published files hold):

- ``groupwise-int`` dense (Qwen3.6-27B; Qwen3.8-27B with W8 embedding and head): embedding and head Q6;
  attention ``query_key`` and GDN ``query_key`` Q4, ``gate_value`` / ``value_z`` / outputs Q5; MLP
  ``gate_up`` Q4, ``down`` Q5; norms, conv, GDN a/b projections BF16; ``a_log``/``dt_bias`` FP32; MTP W8.
- ``groupwise-int`` MoE (Qwen3.6-35B-A3B): embedding, attention/GDN projections and shared experts W8; head
  Q6; routed ``gate_up`` Q4, routed ``down`` Q5 (Q6 in layers 34, 38, 39); router + shared gate one BF16
  ``[E + 1, H]``; MTP and DFlash W8.
- ``nvfp4`` (Qwen3.6-27B): one ``query_key_gate_value`` and one ``query_key_value_z`` parent a layer, NVFP4,
  each with an FP32 ``input_scale_divisor`` (kept for W4A4 prefill) right after it; the attention input of
  layers below 24, the attention output of layers 3 and 7 and the GDN output of layer 4 stay BF16; embedding
  and head W8.
- ``nvfp4`` (Qwen3.8-27B, mixed): NVFP4 MLP (with divisors) in layers 0-55; row-scaled FP8 everywhere else
  (embedding, attention/GDN projections, head, MLP of layers 56-63); GDN a/b one BF16 ``a_b_projection``.

The draft head and DFlash are stored (the whole file is validated) but this engine does not run them; the vision
tower is bound with ``--vision`` (``engine.model.vision_load``). Its inventory is parametric in the tower's
geometry (``VisionGeometry``, default the family's), so a development model converted from a tiny
vision-language checkpoint stores its own small tower in the same layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.artifact.profiles.spec import ObjectSpec, Outputs, ResourceSpec, TensorSpec
from engine.model.config import ModelConfig

if TYPE_CHECKING:
    from engine.model.vision import VisionConfig

BF16, FP32, I32 = "BF16", "FP32", "I32"
Q4, Q5, Q6, W8 = "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"
NVFP4, FP8 = "NVFP4", "FP8_E4M3FN_ROW_BF16S"

FRONTEND = tuple(
    ResourceSpec(f"frontend/{name}")
    for name in (
        "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
        "preprocessor_config.json", "video_preprocessor_config.json",
    )
)  # fmt: skip
DRAFT_ROWS = 131072
MOE_Q6_DOWN_LAYERS = (34, 38, 39)

# (layer, role) -> format; role is the object's suffix under text/layers/{l}/
Allocation = Callable[[int, str], str]


def _t(name: str, shape: tuple[int, ...], fmt: str, outputs: Outputs = ()) -> TensorSpec:
    return TensorSpec(name, shape, fmt, outputs)


def _divisor(parent: TensorSpec, operation: str) -> list[TensorSpec]:
    """The FP32 input divisor stored right after an NVFP4 parent (none for other formats)."""
    if parent.format != NVFP4:
        return []
    group = parent.name.rsplit("/", 1)[0]
    return [_t(f"{group}/{operation}/input_scale_divisor", (), FP32)]


# ----------------------------------------------------------------------------------------------- text layers


def _attention(p: str, c: ModelConfig, fmt: Allocation, layer: int, fused: bool) -> list[TensorSpec]:
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    if fused:
        outs: Outputs = (("query", q), ("key", kv), ("gate", q), ("value", kv))
        parent = _t(
            p + "attention/query_key_gate_value", (2 * q + 2 * kv, h), fmt(layer, "attention/input"), outs
        )
        inputs = [parent, *_divisor(parent, "input_projection")]
    else:
        inputs = [
            _t(p + "attention/query_key", (q + kv, h), fmt(layer, "attention/query_key"), (("query", q), ("key", kv))),
            _t(p + "attention/gate_value", (q + kv, h), fmt(layer, "attention/gate_value"), (("gate", q), ("value", kv))),
        ]  # fmt: skip
    out = _t(p + "attention/output", (h, q), fmt(layer, "attention/output"))
    norms = [
        _t(p + "attention/query_norm", (c.head_dim,), BF16),
        _t(p + "attention/key_norm", (c.head_dim,), BF16),
    ]
    return [*inputs, *norms, out, *_divisor(out, "output_projection")]


def _gdn(
    p: str, c: ModelConfig, fmt: Allocation, layer: int, fused: bool, ab_fused: bool
) -> list[TensorSpec]:
    h, k, v, nv = c.hidden_size, c.linear_key_dim, c.linear_value_dim, c.linear_num_value_heads
    head = [
        _t(p + "gdn/a_log", (nv,), FP32),
        _t(p + "gdn/dt_bias", (nv,), FP32),
        _t(p + "gdn/convolution", (c.linear_conv_kernel_dim, c.conv_dim), BF16),
    ]
    if ab_fused:
        head.append(_t(p + "gdn/a_b_projection", (2 * nv, h), BF16, (("a", nv), ("b", nv))))
    else:
        head += [_t(p + "gdn/a_projection", (nv, h), BF16, (("a", nv),)),
                 _t(p + "gdn/b_projection", (nv, h), BF16, (("b", nv),))]  # fmt: skip
    if fused:
        outs: Outputs = (("query", k), ("key", k), ("value", v), ("z", v))
        parent = _t(p + "gdn/query_key_value_z", (2 * k + 2 * v, h), fmt(layer, "gdn/input"), outs)
        inputs = [parent, *_divisor(parent, "input_projection")]
    else:
        inputs = [
            _t(p + "gdn/query_key", (2 * k, h), fmt(layer, "gdn/query_key"), (("query", k), ("key", k))),
            _t(p + "gdn/value_z", (2 * v, h), fmt(layer, "gdn/value_z"), (("value", v), ("z", v))),
        ]
    out = _t(p + "gdn/output", (h, v), fmt(layer, "gdn/output"))
    return [*head, *inputs, _t(p + "gdn/norm", (c.linear_value_head_dim,), BF16), out, *_divisor(out, "output_projection")]  # fmt: skip


def _mlp(p: str, h: int, inter: int, fmt: Allocation, layer: int) -> list[TensorSpec]:
    gate_up = _t(
        p + "mlp/gate_up", (2 * inter, h), fmt(layer, "mlp/gate_up"), (("gate", inter), ("up", inter))
    )
    down = _t(p + "mlp/down", (h, inter), fmt(layer, "mlp/down"))
    return [gate_up, *_divisor(gate_up, "gate_up_projection"), down, *_divisor(down, "down_projection")]


def _moe(p: str, c: ModelConfig, fmt: Allocation, layer: int) -> list[TensorSpec]:
    h, e, i, s = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
    return [
        _t(p + "moe/router_shared_gate", (e + 1, h), BF16, (("router", e), ("shared_gate", 1))),
        _t(p + "moe/routed_gate_up", (e * 2 * i, h), fmt(layer, "moe/routed_gate_up")),
        _t(p + "moe/routed_down", (e * h, i), fmt(layer, "moe/routed_down")),
        _t(p + "moe/shared_gate_up", (2 * s, h), fmt(layer, "moe/shared_gate_up"), (("gate", s), ("up", s))),
        _t(p + "moe/shared_down", (h, s), fmt(layer, "moe/shared_down")),
    ]


def _layer(
    p: str, c: ModelConfig, fmt: Allocation, layer: int, kind: str, fused: bool, ab_fused: bool
) -> list[TensorSpec]:
    h = c.hidden_size
    if kind == "linear_attention":
        mixer = _gdn(p, c, fmt, layer, fused, ab_fused)
    else:
        mixer = _attention(p, c, fmt, layer, fused)
    if c.is_moe:
        ffn = _moe(p, c, fmt, layer)
    else:
        assert c.intermediate_size is not None
        ffn = _mlp(p, h, c.intermediate_size, fmt, layer)
    return [_t(p + "input_norm", (h,), BF16), *mixer, _t(p + "post_attention_norm", (h,), BF16), *ffn]


def _text(c: ModelConfig, fmt: Allocation, fused: bool, ab_fused: bool) -> list[TensorSpec]:
    """``fused``: one attention / GDN input parent a layer (else the groupwise pairs); ``ab_fused``: one GDN
    ``a_b_projection`` (else ``a_projection`` and ``b_projection``)."""
    h, vocab = c.hidden_size, c.vocab_size
    specs = [_t("text/token_embedding", (vocab, h), fmt(-1, "token_embedding"))]
    for layer, kind in enumerate(c.layer_types):
        specs += _layer(f"text/layers/{layer}/", c, fmt, layer, kind, fused, ab_fused)
    return [
        *specs,
        _t("text/final_norm", (h,), BF16),
        _t("text/output_head", (vocab, h), fmt(-1, "output_head")),
    ]


def _draft_head(c: ModelConfig) -> list[TensorSpec]:
    rows = min(DRAFT_ROWS, c.vocab_size)
    return [_t("text/draft_head", (rows, c.hidden_size), Q4), _t("text/draft_head_token_ids", (rows,), I32)]


def _mtp(c: ModelConfig) -> list[TensorSpec]:
    """The one-layer MTP block, every matrix W8 (embedding and head alias the text tower's)."""
    h, p = c.hidden_size, "mtp/layer/"
    w8: Allocation = lambda layer, role: W8  # noqa: E731
    layer = _layer(p, c, w8, -1, "full_attention", fused=True, ab_fused=True)
    return [
        _t("mtp/input_projection", (h, 2 * h), W8),
        _t("mtp/embedding_norm", (h,), BF16),
        _t("mtp/hidden_norm", (h,), BF16),
        *layer,
        _t("mtp/final_norm", (h,), BF16),
    ]


@dataclass(frozen=True, slots=True)
class VisionGeometry:
    """The vision tower's stored geometry: ``depth`` blocks of ``width`` with an MLP of ``mlp_width``, a patch
    embedding over ``patch_input`` (= in_channels * temporal_patch * patch^2) pixels, a learned position table of
    ``positions`` rows, and a merger of ``merge_unit`` patches to ``out_hidden`` (the text width). The defaults
    are the Qwen3.5 family's (what every published file stores)."""

    out_hidden: int
    depth: int = 27
    width: int = 1152
    mlp_width: int = 4304
    patch_input: int = 1536  # 3 x 2 x 16 x 16
    positions: int = 2304  # 48 x 48
    merge_unit: int = 4  # 2 x 2

    @classmethod
    def of(cls, config: VisionConfig) -> VisionGeometry:
        """The geometry of a tower's ``VisionConfig`` (``engine.model.vision``)."""
        return cls(
            out_hidden=config.out_hidden_size, depth=config.depth, width=config.hidden_size,
            mlp_width=config.intermediate_size, patch_input=config.patch_dim,
            positions=config.num_position_embeddings, merge_unit=config.merge_unit,
        )  # fmt: skip


def _vision(g: VisionGeometry) -> list[TensorSpec]:
    """The vision tower (the family's: 27 blocks of 1152) and its merger to ``g.out_hidden``."""
    w, mlp, merged, b = g.width, g.mlp_width, g.merge_unit * g.width, "vision/layers/"
    specs = [_t("vision/patch_embedding", (w, g.patch_input), Q6), _t("vision/patch_embedding_bias", (w,), BF16),
             _t("vision/position_embedding", (g.positions, w), BF16)]  # fmt: skip
    for i in range(g.depth):
        p = f"{b}{i}/"
        specs += [
            _t(p + "attention/qkv", (3 * w, w), Q4), _t(p + "attention/qkv_bias", (3 * w,), BF16),
            _t(p + "attention/output", (w, w), Q5), _t(p + "attention/output_bias", (w,), BF16),
            _t(p + "mlp/fc1", (mlp, w), Q4), _t(p + "mlp/fc1_bias", (mlp,), BF16),
            _t(p + "mlp/fc2", (w, mlp), Q5), _t(p + "mlp/fc2_bias", (w,), BF16),
            *(_t(p + n, (w,), BF16) for n in ("norm1/weight", "norm1/bias", "norm2/weight", "norm2/bias")),
        ]  # fmt: skip
    return specs + [
        _t("vision/merger/fc1", (merged, merged), W8), _t("vision/merger/fc1_bias", (merged,), BF16),
        _t("vision/merger/fc2", (g.out_hidden, merged), W8), _t("vision/merger/fc2_bias", (g.out_hidden,), BF16),
        _t("vision/merger/norm/weight", (w,), BF16), _t("vision/merger/norm/bias", (w,), BF16),
    ]  # fmt: skip


def _dflash(h: int) -> list[TensorSpec]:
    """The 35B-A3B DFlash drafter: 6 dense blocks (32 Q / 8 KV heads of 128, MLP 6144), W8."""
    specs = [_t("dflash/feature_projection", (h, 8 * h), W8), _t("dflash/context_norm", (h,), BF16)]
    for i in range(6):
        p = f"dflash/layers/{i}/"
        specs += [
            _t(p + "input_norm", (h,), BF16), _t(p + "attention/query_key_value", (6144, h), W8),
            _t(p + "attention/query_norm", (128,), BF16), _t(p + "attention/key_norm", (128,), BF16),
            _t(p + "attention/output", (h, 4096), W8), _t(p + "post_attention_norm", (h,), BF16),
            _t(p + "mlp/gate_up", (12288, h), W8), _t(p + "mlp/down", (h, 6144), W8),
        ]  # fmt: skip
    return [*specs, _t("dflash/final_norm", (h,), BF16)]


# ----------------------------------------------------------------------------------------------- allocations


def _groupwise_dense(vocab: str) -> Allocation:
    low = ("attention/query_key", "gdn/query_key", "mlp/gate_up")

    def fmt(layer: int, role: str) -> str:
        if role in ("token_embedding", "output_head"):
            return vocab
        return Q4 if role in low else Q5

    return fmt


def _groupwise_moe(layer: int, role: str) -> str:
    if role == "output_head":
        return Q6
    if role == "moe/routed_gate_up":
        return Q4
    if role == "moe/routed_down":
        return Q6 if layer in MOE_Q6_DOWN_LAYERS else Q5
    return W8


def _nvfp4_27b(layer: int, role: str) -> str:
    if role in ("token_embedding", "output_head"):
        return W8
    bf16 = (
        (role == "attention/input" and layer < 24)
        or (role == "attention/output" and layer in (3, 7))
        or (role == "gdn/output" and layer == 4)
    )
    return BF16 if bf16 else NVFP4


def _nvfp4_38b(layer: int, role: str) -> str:
    return NVFP4 if role.startswith("mlp/") and layer < 56 else FP8


# ----------------------------------------------------------------------------------------------- inventories


def _full(
    c: ModelConfig,
    text: list[TensorSpec],
    complete: bool,
    vision: VisionGeometry | None,
    extra: tuple[TensorSpec, ...] = (),
) -> tuple[ObjectSpec, ...]:
    """The whole file (``complete``: what the published artifacts hold; its tower ``vision``, default the
    family's) or, for a development model converted from a checkpoint, the text tower, the MTP block and (with
    ``vision``: a vision-language checkpoint) the vision tower."""
    mtp = _mtp(c) if c.mtp_num_hidden_layers > 0 else []
    if not complete:
        return (*text, *mtp, *(_vision(vision) if vision is not None else ()))
    tower = _vision(vision if vision is not None else VisionGeometry(c.hidden_size))
    return (*FRONTEND, *text, *_draft_head(c), *mtp, *tower, *extra)


Builder = Callable[[ModelConfig, bool, VisionGeometry | None], tuple[ObjectSpec, ...]]


def dense_groupwise(vocab: str) -> Builder:
    def build(c: ModelConfig, complete: bool, vision: VisionGeometry | None = None) -> tuple[ObjectSpec, ...]:
        return _full(c, _text(c, _groupwise_dense(vocab), fused=False, ab_fused=False), complete, vision)

    return build


def dense_nvfp4_27b(
    c: ModelConfig, complete: bool, vision: VisionGeometry | None = None
) -> tuple[ObjectSpec, ...]:
    return _full(c, _text(c, _nvfp4_27b, fused=True, ab_fused=False), complete, vision)


def dense_nvfp4_38b(
    c: ModelConfig, complete: bool, vision: VisionGeometry | None = None
) -> tuple[ObjectSpec, ...]:
    return _full(c, _text(c, _nvfp4_38b, fused=True, ab_fused=True), complete, vision)


def moe_groupwise(
    c: ModelConfig, complete: bool, vision: VisionGeometry | None = None
) -> tuple[ObjectSpec, ...]:
    text = _text(c, _groupwise_moe, fused=True, ab_fused=True)
    return _full(c, text, complete, vision, tuple(_dflash(c.hidden_size)) if complete else ())
