"""Build a model from an artifact stored in a weight profile (``engine.artifact.profiles``).

The artifact's identity names its profile (no runtime flag). Loading then goes:

1. ``check_inventory``: the file's objects must be exactly the profile's at the model's geometry (same names,
   shapes, formats and layouts); any difference is an ``ArtifactError`` naming the object, raised before any
   weight is read. (The container reader has already refused unknown formats and layouts, and truncated or
   mis-sized objects, by name, when the file was opened.)
2. The model is built on the meta device; every object is bound to the module that consumes it
   (``_bind``): plain tensors (norms, conv taps, ``A_log``/``dt_bias``, BF16 projections) become parameters
   in the model dtype; a quantized object becomes one quantized ``Linear`` (``engine.model.quant``) holding
   its payload, and a fused parent keeps its row ranges as the layer's named outputs (``query_key``
   [query, key], ``value_z`` [value, z], ``mlp/gate_up`` [gate, up] ...), the layer's ``input_projections``
   listing the parents it reads. An NVFP4 site's ``input_scale_divisor`` rides on its parent's weight.
3. Objects the text model does not run (vision tower, optimized draft head, DFlash) are validated and skipped
   here; the vision tower is bound by ``engine.model.vision_load.load_vision`` (``--vision``).
4. ``fuse_gdn_gates``: a GDN layer's separate BF16 ``a_projection`` / ``b_projection`` become one GEMV.

MoE: a layer's routed expert banks (``moe/routed_gate_up`` [E * 2I, H], ``moe/routed_down`` [E * H, I], the
groupwise-int profile's Q4 / Q5 / Q6) stay quantized: they become the layer's ``QuantExperts``
(``engine.model.quant_experts``), two payloads holding the file's bytes, decode streaming them through
``kernels.quant.quant_moe_experts``; after every object is bound, the one ``ExpertScratch`` that all those layers
share for prefill (the dense banks of one layer at a time) is allocated, once. Under
``NINFER_MOE_EXPERTS=dequantized`` (``engine.env``), or for a bank in a format without those kernels, the banks
are dequantized once at load into the dense [E, 2I, H] / [E, H, I] ``Experts`` instead (bf16: about 3x the
bytes). Everything else of the MoE block (shared expert, router) keeps its stored form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
from torch import nn

from engine.artifact.container import ArtifactError, Directory
from engine.artifact.profiles import TensorSpec, VisionGeometry, WeightProfile
from engine.env import moe_experts_mode
from engine.model.config import ModelConfig
from engine.model.fusion import concat_linears
from engine.model.gdn import GatedDeltaNet
from engine.model.linear import DenseMethod, Linear
from engine.model.mlp import SparseMoeBlock
from engine.model.quant import QuantEmbedding, make_quantized, quantized_linear
from engine.model.quant_experts import ExpertScratch, QuantBank, QuantExperts, allocate_scratch
from engine.model.qwen3_5 import Qwen3_5ForCausalLM, model_class
from engine.progress import progress
from kernels.quant import GROUP_FORMATS, dequantize, view_planes

SKIPPED_PREFIXES = ("vision/", "dflash/", "text/draft_head")
_MAX_LISTED = 10


class ProfileSource(Protocol):
    """What loading by profile needs from an artifact (``engine.artifact.container.Artifact``)."""

    directory: Directory

    def tensor(self, name: str) -> torch.Tensor: ...

    def raw_bytes(self, name: str) -> memoryview: ...


# A source may also offer ``payload(name, device) -> torch.Tensor`` (a quantized object's payload already on
# ``device``): ``engine.testing.synthetic_quant`` draws random payloads there instead of reading a file.


def check_inventory(
    directory: Directory, profile: WeightProfile, config: ModelConfig, vision: VisionGeometry | None = None
) -> list[TensorSpec]:
    """The profile's tensor specs (with the vision tower of geometry ``vision``: see ``WeightProfile.objects``),
    after checking that ``directory`` holds exactly them (ArtifactError naming the objects otherwise)."""
    specs = [s for s in profile.objects(config, vision) if isinstance(s, TensorSpec)]
    stored = {t.name: t for t in directory.tensors}
    expected = {s.name: s for s in specs}
    problems: list[str] = []
    for name in expected.keys() - stored.keys():
        problems.append(f"{name!r} missing")
    for name in stored.keys() - expected.keys():
        problems.append(f"{name!r} not in the profile")
    for name in expected.keys() & stored.keys():
        spec, entry = expected[name], stored[name]
        if (tuple(spec.shape), spec.format, spec.layout) != (entry.shape, entry.format, entry.layout):
            problems.append(
                f"{name!r} is {list(entry.shape)} {entry.format}/{entry.layout},"
                f" the profile has {list(spec.shape)} {spec.format}/{spec.layout}"
            )
    if problems:
        problems.sort()
        listed = "; ".join(problems[:_MAX_LISTED]) + (
            f"; ... ({len(problems)} in all)" if len(problems) > _MAX_LISTED else ""
        )
        raise ArtifactError(f"{directory.model_id}/{directory.weights_id}: inventory does not match profile {profile.key}: {listed}")  # fmt: skip
    return specs


def stored_payload(source: ProfileSource, name: str, device: torch.device) -> torch.Tensor:
    """An object's payload bytes (uint8) on ``device`` (a synthetic source draws them there)."""
    draw = getattr(source, "payload", None)
    if draw is not None:
        return cast(torch.Tensor, draw(name, device))
    raw = torch.frombuffer(source.raw_bytes(name), dtype=torch.uint8)
    return raw.to(device) if device.type != "cpu" else raw


def stored_value(source: ProfileSource, spec: TensorSpec, device: torch.device) -> torch.Tensor:
    """An object's represented value on ``device`` (quantized: float32 by the exact decoder)."""
    if not spec.quantized:
        return source.tensor(spec.name).to(device)
    return dequantize(
        view_planes(spec.format, stored_payload(source, spec.name, device), list(spec.shape[:2]))
    )


class _Loader:
    def __init__(
        self, source: ProfileSource, model: Qwen3_5ForCausalLM, device: torch.device, dtype: torch.dtype
    ):
        self.source, self.model, self.device, self.dtype = source, model, device, dtype
        self.last_quantized: Linear | None = None
        self.quantized_experts = moe_experts_mode() == "quantized"
        self.scratch = ExpertScratch()  # shared by every QuantExperts; allocated once the model is bound

    def plain(self, name: str) -> nn.Parameter:
        t = self.source.tensor(name)
        target = self.dtype if t.is_floating_point() else t.dtype
        return nn.Parameter(t.to(device=self.device, dtype=target), requires_grad=False)

    def payload(self, name: str) -> torch.Tensor:
        return stored_payload(self.source, name, self.device)

    def linear(self, spec: TensorSpec, layer: Linear | None = None) -> Linear:
        """The layer for a stored matrix: ``layer`` itself (a dense Linear the model built) made to hold it,
        or a new parent with the object's row ranges."""
        n, k = spec.shape
        outputs = list(spec.outputs) or [("out", n)]
        if layer is None:
            if spec.quantized:
                layer = quantized_linear(k, n, outputs, spec.format, self.payload(spec.name))
            else:
                with torch.device("meta"):
                    layer = Linear(k, n, outputs)
                layer.weight = self.plain(spec.name)
        elif spec.quantized:
            make_quantized(layer, spec.format, self.payload(spec.name))
        else:
            layer.weight = self.plain(spec.name)
        self.last_quantized = layer if spec.quantized else None
        return layer

    def divisor(self, spec: TensorSpec) -> None:
        parent = self.last_quantized
        assert parent is not None and parent.qweight is not None, f"{spec.name}: no NVFP4 parent before it"
        value = float(self.source.tensor(spec.name).item())
        parent.qweight = view_planes(
            parent.method.format, cast(torch.Tensor, parent.payload),
            (parent.out_features, parent.in_features), input_divisor=value,
        )  # fmt: skip


def _parents(module: Any, attr: str, layer: Linear) -> None:
    """Add a stored input-projection parent to ``module`` (attention, GDN, MLP), after any earlier ones."""
    current: tuple[str, ...] = module.input_projections
    default = {"q_proj", "k_proj", "v_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
               "gate_proj", "up_proj"}  # fmt: skip
    if current and current[0] in default:  # the checkpoint's own projections: replaced by the stored parents
        for name in current:
            delattr(module, name)
        current = ()
    setattr(module, attr, layer)
    module.input_projections = (*current, attr)


def _bind_layer(load: _Loader, layer: Any, role: str, spec: TensorSpec) -> None:
    """Bind one object under ``text/layers/{l}/`` or ``mtp/layer/`` (``role`` is the rest of its name)."""
    group, _, leaf = role.rpartition("/")
    if role in ("input_norm", "post_attention_norm"):
        norm = layer.input_layernorm if role == "input_norm" else layer.post_attention_layernorm
        norm.weight = load.plain(spec.name)
    elif group == "attention":
        attn = layer.self_attn
        if leaf in ("query_norm", "key_norm"):
            (attn.q_norm if leaf == "query_norm" else attn.k_norm).weight = load.plain(spec.name)
        elif leaf == "output":
            load.linear(spec, attn.o_proj)
        else:  # query_key, gate_value, query_key_gate_value
            _parents(attn, leaf, load.linear(spec))
    elif group == "gdn":
        gdn = layer.linear_attn
        if leaf in ("a_log", "dt_bias"):
            setattr(gdn, "A_log" if leaf == "a_log" else "dt_bias", load.plain(spec.name))
        elif leaf == "convolution":  # stored tap-major [K, C]; the model's conv1d weight is [C, 1, K]
            taps = load.plain(spec.name)
            gdn.conv1d.weight = nn.Parameter(taps.t().contiguous().unsqueeze(1), requires_grad=False)
        elif leaf == "norm":
            gdn.norm.weight = load.plain(spec.name)
        elif leaf == "output":
            load.linear(spec, gdn.out_proj)
        else:  # a_projection, b_projection, a_b_projection, query_key, value_z, query_key_value_z
            _parents(gdn, leaf, load.linear(spec))
    elif group == "mlp":
        if leaf == "gate_up":
            _parents(layer.mlp, "gate_up_proj", load.linear(spec))
        else:
            load.linear(spec, layer.mlp.down_proj)
    elif group == "moe":
        _bind_moe(load, layer.mlp, leaf, spec)
    else:
        raise ArtifactError(f"{spec.name}: no model role for this object")


def _bind_moe(load: _Loader, moe: SparseMoeBlock, leaf: str, spec: TensorSpec) -> None:
    if leaf == "router_shared_gate":
        rows = load.plain(spec.name)
        moe.gate.weight = nn.Parameter(rows[:-1], requires_grad=False)
        moe.shared_expert_gate.weight = nn.Parameter(rows[-1:], requires_grad=False)
    elif leaf in ("routed_gate_up", "routed_down"):
        _bind_routed(load, moe, leaf, spec)
    elif leaf == "shared_gate_up":
        _parents(moe.shared_expert, "gate_up_proj", load.linear(spec))
    else:
        load.linear(spec, moe.shared_expert.down_proj)


def _bind_routed(load: _Loader, moe: SparseMoeBlock, leaf: str, spec: TensorSpec) -> None:
    """A routed bank: kept quantized (a ``QuantBank`` of the layer's ``QuantExperts``, gate_up first, as the
    profile orders them), or dequantized into the dense ``Experts`` (see the module docstring)."""
    experts = moe.experts
    shape = (spec.shape[0], spec.shape[1])
    if isinstance(experts, QuantExperts):  # gate_up was kept quantized: so is down
        experts.set_down(QuantBank(spec.format, load.payload(spec.name), shape))
    elif leaf == "routed_gate_up" and load.quantized_experts and spec.format in GROUP_FORMATS:
        config = load.model.config
        bank = QuantBank(spec.format, load.payload(spec.name), shape)
        moe.experts = QuantExperts(config.num_experts, config.hidden_size, config.moe_intermediate_size, bank,
                                   load.scratch)  # fmt: skip
    else:
        name = "gate_up_proj" if leaf == "routed_gate_up" else "down_proj"
        dense = getattr(experts, name)
        weight = stored_value(load.source, spec, load.device).to(load.dtype)
        setattr(experts, name, nn.Parameter(weight.view(dense.shape), requires_grad=False))


def _binder(load: _Loader) -> Callable[[TensorSpec], None]:
    model = load.model
    text = model.model

    def bind(spec: TensorSpec) -> None:
        name = spec.name
        if name.endswith("/input_scale_divisor"):
            load.divisor(spec)
        elif name == "text/token_embedding":
            if spec.quantized:
                shape = (spec.shape[0], spec.shape[1])
                embedding = QuantEmbedding(spec.format, load.payload(name), shape, load.dtype)
                text.embed_tokens = embedding  # type: ignore[assignment]  # a stand-in for nn.Embedding
            else:
                text.embed_tokens.weight = load.plain(name)
        elif name == "text/final_norm":
            text.norm.weight = load.plain(name)
        elif name == "text/output_head":
            assert model.lm_head is not None
            load.linear(spec, model.lm_head)
        elif name.startswith("text/layers/"):
            _, _, index, role = name.split("/", 3)
            _bind_layer(load, text.layers[int(index)], role, spec)
        elif name.startswith("mtp/"):
            _bind_mtp(load, spec)
        else:
            raise ArtifactError(f"{name}: no model role for this object")

    return bind


def _bind_mtp(load: _Loader, spec: TensorSpec) -> None:
    mtp = load.model.mtp
    if mtp is None:
        return
    name = spec.name
    if name.startswith("mtp/layer/"):
        _bind_layer(load, mtp.layers[0], name[len("mtp/layer/") :], spec)
    elif name == "mtp/input_projection":
        load.linear(spec, mtp.fc)
    else:
        norm = {"mtp/embedding_norm": mtp.pre_fc_norm_embedding, "mtp/hidden_norm": mtp.pre_fc_norm_hidden,
                "mtp/final_norm": mtp.norm}[name]  # fmt: skip
        norm.weight = load.plain(name)


def load_profile_model(
    source: ProfileSource,
    profile: WeightProfile,
    config: ModelConfig,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    with_mtp: bool = False,
    vision: VisionGeometry | None = None,
) -> Qwen3_5ForCausalLM:
    """The model of an artifact stored in ``profile`` (checked against it first, see the module docstring;
    ``vision``: the geometry of the vision tower the file stores, default none at a development geometry)."""
    specs = check_inventory(source.directory, profile, config, vision)
    with torch.device("meta"):
        model = model_class(config)(config, with_mtp=with_mtp)
    load = _Loader(source, model, torch.device(device), dtype)
    bind = _binder(load)
    used = [
        s
        for s in specs
        if not s.name.startswith(SKIPPED_PREFIXES) and (with_mtp or not s.name.startswith("mtp/"))
    ]
    with progress(sum(s.bytes for s in used), f"loading {profile.key} weights to {device}") as bar:
        for spec in used:
            bind(spec)
            bar.update(spec.bytes)
    meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if meta:
        raise ArtifactError(f"{profile.key}: no stored object fills {', '.join(meta[:_MAX_LISTED])}")
    allocate_scratch(model, load.device, dtype)
    fuse_gdn_gates(model)
    return model.requires_grad_(False).eval()


def fuse_gdn_gates(model: nn.Module) -> int:
    """Fuse each GDN layer's stored BF16 ``a_projection`` and ``b_projection`` (the profiles without one
    ``a_b_projection``: the 27B groupwise-int and nvfp4) into one ``a_b_projection`` (outputs a then b, as the
    profiles that store it fused): one GEMV a decode layer instead of two (session 8's H200 profile of the 27B
    groupwise-int step: 96 cuBLAS GEMVs of [48, 5120] and their 96 split-K reduces, 0.58 ms of kernels). The layer
    reads its outputs by name, so nothing else changes. Returns how many layers it fused."""
    fused = 0
    for gdn in (m for m in model.modules() if isinstance(m, GatedDeltaNet)):
        names: tuple[str, ...] = gdn.input_projections
        if "a_projection" not in names or "b_projection" not in names:
            continue
        a, b = gdn.a_projection, gdn.b_projection
        if not (isinstance(a, Linear) and isinstance(b, Linear)):
            continue
        if not (isinstance(a.method, DenseMethod) and isinstance(b.method, DenseMethod)):
            continue
        gdn.a_b_projection = concat_linears(a, b)
        del gdn.a_projection, gdn.b_projection
        gdn.input_projections = (
            *(n for n in names if n not in ("a_projection", "b_projection")),
            "a_b_projection",
        )
        fused += 1
    return fused
