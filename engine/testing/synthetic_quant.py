"""Synthetic quantized models: random weights in a weight profile's formats, drawn directly on the device.

``ninfer-bench --synthetic GEOMETRY --weights-id PROFILE`` and ``ninfer-serve --synthetic GEOMETRY --weights-id
PROFILE`` run the model a published artifact would give, without the file: every object of the profile's
inventory at the geometry (same names, shapes, formats, layouts, fused parents) gets a random payload of
exactly its stored size, built on the device, and the model is bound by ``engine.model.profile_load``, the code
path a real artifact takes. So a step costs what it costs on the real weights (same kernels, same bytes).

Payloads (``random_payload``) are valid words of the format, not random bytes, with weight values near the
dense synthetic model's (std ~0.02):

- row-split (Q4/Q5/Q6/W8): uniform codes in the format's range (W8 never -128), padding lanes code 0, one
  positive binary16 scale a group (groups wholly past K scale 0);
- NVFP4: uniform E2M1 words, positive finite E4M3 block scales, the FP32 weight divisor in the last 4 bytes;
- FP8 rows: E4M3 codes of a normal draw (no NaN words), positive BF16 row scales.

Plain objects follow ``engine.testing.synthetic.build_synthetic``: matrices normal(0, 0.02), ``a_log`` uniform
in [0, 2.7], ``dt_bias`` and the GDN norm 1, other norms 0 (``(1 + w)``), NVFP4 input divisors 1.

``PROFILE`` is a profile key (``qwen3.6-27b/groupwise-int``, ``qwen3.8-27b/nvfp4``: any published profile,
applied at the geometry) or a kind (``groupwise-int``, ``nvfp4``, ``nvfp4-mixed``: the dense or MoE profile of
that kind, ``engine.artifact.profiles.DEVELOPMENT_KINDS``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from engine.artifact.container import Directory, TensorEntry
from engine.artifact.profiles import DEVELOPMENT_KINDS, PROFILES, TensorSpec, WeightProfile
from engine.model.config import ModelConfig
from engine.model.linear import DENSE, Linear
from engine.model.mlp import SparseMoeBlock
from engine.model.profile_load import SKIPPED_PREFIXES, load_profile_model
from engine.model.quant import QuantEmbedding
from engine.model.quant_experts import QuantExperts
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from kernels.quant import FP8, GROUP_FORMATS, NVFP4, dequantize, geometry

WEIGHT_STD = 0.02
_CHUNK = 1 << 26  # elements drawn at once (bounds the float32 temporaries of a large matrix)


def synthetic_profile(weights_id: str, config: ModelConfig) -> WeightProfile:
    """The profile ``weights_id`` names (a profile key, or a kind at this geometry); ValueError otherwise."""
    if weights_id in PROFILES:
        profile = PROFILES[weights_id]
        published = profile.published
        if published is not None and published.is_moe != config.is_moe:
            raise ValueError(
                f"--weights-id {weights_id}: a {'MoE' if published.is_moe else 'dense'} profile, the geometry is not"
            )
        return profile
    kinds = DEVELOPMENT_KINDS["moe" if config.is_moe else "dense"]
    if weights_id in kinds:
        return kinds[weights_id]
    known = sorted({*PROFILES, *kinds})
    raise ValueError(f"--weights-id {weights_id!r}: expected one of {', '.join(known)}")


def _uniform_bytes(
    count: int, low: int, high: int, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    return torch.randint(low, high, (count,), generator=gen, device=device, dtype=torch.int16).to(torch.uint8)


def _group_payload(
    fmt: str, shape: tuple[int, int], gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    geo = geometry(fmt, shape)
    spec = GROUP_FORMATS[fmt]
    n, k = shape
    payload = torch.zeros(geo.payload_bytes, dtype=torch.uint8, device=device)
    codes = payload[: geo.codes_bytes].view(n, geo.codes_row_bytes)
    if spec.bits == 8:
        codes.view(-1).copy_(_uniform_bytes(geo.codes_bytes, -127, 128, gen, device))  # two's complement
        codes[:, k:] = 0
    else:
        codes.view(-1).copy_(_uniform_bytes(geo.codes_bytes, 0, 256, gen, device))
        codes[:, (k + 1) // 2 :] = 0
        if k % 2:
            codes[:, k // 2] &= 0x0F  # the last lane is the low nibble: its neighbour is padding
    if geo.high_bytes:
        extra = spec.bits - 4
        high = payload[geo.high_offset : geo.high_offset + geo.high_bytes].view(n, geo.high_row_bytes)
        high.view(-1).copy_(_uniform_bytes(geo.high_bytes, 0, 256, gen, device))
        full, rest = divmod(k * extra, 8)  # bits of logical lanes: whole bytes, then a partial one
        if rest:
            high[:, full] &= (1 << rest) - 1
            full += 1
        high[:, full:] = 0
    std = 0.577 * spec.qmax  # std of a uniform code in [qmin, qmax]
    scales = payload[geo.scales_offset :].view(torch.float16).view(n, geo.groups_per_row)
    draw = torch.empty(n, geo.groups_per_row, device=device).uniform_(0.5, 1.5, generator=gen)
    scales.copy_((draw * (WEIGHT_STD / std)).to(torch.float16))
    scales[:, -(-k // spec.group_size) :] = 0
    return payload


def _nvfp4_payload(shape: tuple[int, int], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    geo = geometry(NVFP4, shape)
    payload = torch.empty(geo.payload_bytes, dtype=torch.uint8, device=device)
    payload[: geo.scales_offset] = 0
    payload[: geo.codes_bytes] = _uniform_bytes(geo.codes_bytes, 0, 256, gen, device)
    divisor = 448.0 * 6.0 / 0.1  # d_w of a matrix whose largest |w| is 0.1
    scale = torch.empty(geo.scales_bytes, device=device).uniform_(0.5, 1.5, generator=gen)
    scale = (scale * (WEIGHT_STD * divisor / 2.9)).clamp(max=448.0)  # E2M1 words' std is ~2.9
    payload[geo.scales_offset : geo.divisor_offset] = scale.to(torch.float8_e4m3fn).view(torch.uint8)
    payload[geo.divisor_offset :] = torch.tensor([divisor], dtype=torch.float32).view(torch.uint8).to(device)
    return payload


def _fp8_payload(shape: tuple[int, int], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    geo = geometry(FP8, shape)
    n, k = shape
    payload = torch.zeros(geo.payload_bytes, dtype=torch.uint8, device=device)
    codes = payload[: geo.codes_bytes]
    for start in range(0, geo.codes_bytes, _CHUNK):
        end = min(start + _CHUNK, geo.codes_bytes)
        draw = torch.empty(end - start, device=device).normal_(0.0, 100.0, generator=gen)
        codes[start:end] = draw.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    draw = torch.empty(n, device=device).uniform_(0.5, 1.5, generator=gen)
    payload[geo.scales_offset :] = (draw * (WEIGHT_STD / 100.0)).to(torch.bfloat16).view(torch.uint8)
    return payload


def random_payload(
    fmt: str, shape: tuple[int, int], gen: torch.Generator, device: torch.device | str
) -> torch.Tensor:
    """A random payload of ``fmt`` (valid words, see the module docstring), exactly ``payload_bytes`` long,
    built on ``device``."""
    dev = torch.device(device)
    if fmt in GROUP_FORMATS:
        return _group_payload(fmt, shape, gen, dev)
    if fmt == NVFP4:
        return _nvfp4_payload(shape, gen, dev)
    if fmt == FP8:
        return _fp8_payload(shape, gen, dev)
    raise ValueError(f"unknown quantized format {fmt!r}")


def _plain(spec: TensorSpec, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    dtype = torch.float32 if spec.format in ("FP32", "BF16") else torch.int32
    t = torch.empty(spec.shape, dtype=dtype, device=device)
    leaf = spec.name.rsplit("/", 1)[-1]
    if dtype == torch.int32:
        return t.zero_()
    if len(spec.shape) >= 2:
        return t.normal_(0.0, WEIGHT_STD, generator=gen)
    if leaf == "a_log":
        return t.uniform_(0.0, 2.7, generator=gen)  # decay rates exp(A_log) in 1 .. 15
    if leaf in ("dt_bias", "input_scale_divisor") or spec.name.endswith("gdn/norm"):
        return t.fill_(1.0)
    return t.zero_()  # (1 + w) RMSNorm weights


class SyntheticProfileSource:
    """A ``profile_load.ProfileSource`` whose objects are drawn on ``device`` (nothing read from a file): the
    directory lists the profile's inventory at the geometry; ``payload(name, device)`` gives each quantized
    object's random payload already on the device."""

    def __init__(
        self, profile: WeightProfile, config: ModelConfig, device: torch.device | str, seed: int = 0
    ) -> None:
        self.profile, self.device = profile, torch.device(device)
        specs = [s for s in profile.objects(config) if isinstance(s, TensorSpec)]
        self.specs = {s.name: s for s in specs}
        entries = tuple(TensorEntry(s.name, tuple(s.shape), s.format, s.layout, 0, s.bytes) for s in specs)
        self.directory = Directory(2, profile.model_id, profile.weights_id, entries, (), 0, 0)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def tensor(self, name: str) -> torch.Tensor:
        return _plain(self.specs[name], self.gen, self.device)

    def raw_bytes(self, name: str) -> memoryview:
        raise NotImplementedError("a synthetic source has no file bytes: use payload(name, device)")

    def payload(self, name: str, device: torch.device) -> torch.Tensor:
        spec = self.specs[name]
        n, k = spec.shape
        return random_payload(spec.format, (n, k), self.gen, device)


def build_synthetic_quantized(
    config: ModelConfig,
    weights_id: str,
    seed: int = 0,
    *,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
) -> Qwen3_5ForCausalLM:
    """The geometry in profile ``weights_id`` with random payloads drawn on ``device``, bound as a real artifact
    of that profile is (``load_profile_model``; MTP off, as ``load_model``'s default)."""
    profile = synthetic_profile(weights_id, config)
    source = SyntheticProfileSource(profile, config, device, seed)
    return load_profile_model(source, profile, config, device, dtype)


def dequantized_twin(model: Qwen3_5ForCausalLM) -> Qwen3_5ForCausalLM:
    """A copy of ``model`` whose quantized layers, routed experts and embedding hold their exactly dequantized
    weights, dense in the model dtype (``DenseMethod``, ``Experts``): the model's bf16 twin, for checking a
    quantized model against it."""
    twin = copy.deepcopy(model)
    dtype = twin.model.norm.weight.dtype
    for module in twin.modules():
        if isinstance(module, Linear) and module.qweight is not None:
            weight = dequantize(module.qweight).to(dtype).contiguous()
            del module._buffers["payload"]
            module.qweight, module.method = None, DENSE
            module.weight = nn.Parameter(weight, requires_grad=False)
    for module in twin.modules():
        if isinstance(module, SparseMoeBlock) and isinstance(module.experts, QuantExperts):
            module.experts = module.experts.dequantized(dtype)
    embed = twin.model.embed_tokens
    if isinstance(embed, QuantEmbedding):
        dense = nn.Embedding(
            embed.num_embeddings, embed.embedding_dim, device=embed.payload.device, dtype=dtype
        )
        dense.weight = nn.Parameter(dequantize(embed.qweight).to(dtype).contiguous(), requires_grad=False)
        twin.model.embed_tokens = dense
    return twin


def quantized_bytes(model: Qwen3_5ForCausalLM) -> int:
    """Bytes of the model's quantized payloads (buffers named ``payload``)."""
    total = 0
    for name, buffer in model.named_buffers():
        if name.rsplit(".", 1)[-1] == "payload":
            total += buffer.numel()
    return total


__all__ = [
    "SKIPPED_PREFIXES",
    "SyntheticProfileSource",
    "build_synthetic_quantized",
    "dequantized_twin",
    "quantized_bytes",
    "random_payload",
    "synthetic_profile",
]
