"""Pre-quantized sources: NVFP4 words copied from ModelOpt and compressed-tensors checkpoints into a profile.

The published NVFP4 artifacts were made from pre-quantized Hugging Face checkpoints, not from bf16 weights, so
``convert`` copies such a checkpoint's words instead of re-encoding dequantized values (which would round twice).
Two exporters' layouts are read (``detect`` tells them apart from ``config.json`` / ``hf_quant_config.json``):

- ModelOpt (``quant_method: modelopt``, ``quant_algo: NVFP4``): per linear ``weight`` (uint8 ``[N, K/2]``, two
  E2M1 codes a byte, the lower K in the low nibble), ``weight_scale`` (float8_e4m3fn ``[N, K/16]``),
  ``weight_scale_2`` (float32 scalar, a multiplier: ``W = e2m1 * scale * weight_scale_2``) and ``input_scale``
  (float32 scalar, ``amax(x) / (448 * 6)``);
- compressed-tensors (``quant_method: compressed-tensors``, format ``nvfp4-pack-quantized``): ``weight_packed``,
  ``weight_scale`` as above, ``weight_global_scale`` (a divisor: ``W = e2m1 * scale / global``) and
  ``input_global_scale`` (a divisor of the input).

Both map onto ``blockscale-k16-m128x4-v1`` exactly: the codes and the scale words are the same bytes; NInfer's
weight divisor is ``1 / weight_scale_2`` (ModelOpt) or ``weight_global_scale``; the site's input divisor is
``1 / input_scale`` or ``input_global_scale``. A fused parent (``query_key_gate_value``, ``mlp/gate_up``, ...)
is the row concatenation of its children, so its rows must share one weight divisor. When the children's
divisors differ, the parent takes the smallest and the other rows' scale words are re-rounded to E4M3
(``scale * d_parent / d_child``, nearest even): that object is no longer bit-exact and ``spec_words`` says so
in its ``rescaled`` count. The parent's input divisor is the smallest of its children's (the largest calibrated
input range), since all of them read the same input.

Rows are gathered with ``hf_source.source_tensor`` itself: each child is handed to it as one uint8 "bundle"
row per weight row (codes, scale words, the divisor's and the input divisor's FP32 bytes side by side), so
every split, interleave and concatenation the bf16 path applies is applied to the words unchanged.

Out of scope (refused by name, or re-encoded with a note): MoE experts stored per expert in NVFP4 (no published
NVFP4 MoE profile), and every other quantized source format (FP8 weights are dequantized and re-encoded by our
FP8-rows encoder; the caller reports each re-encoded object).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.artifact.container import ArtifactError
from engine.artifact.profiles.hf_source import source_tensor
from engine.artifact.profiles.spec import TensorSpec
from engine.model.config import ModelConfig

MODELOPT, COMPRESSED_TENSORS = "modelopt", "compressed-tensors"
_BLOCK = 16
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# checkpoint suffix -> role, per exporter
_SUFFIXES = {
    MODELOPT: {
        "weight": "codes", "weight_scale": "scales", "weight_scale_2": "weight_multiplier",
        "input_scale": "input_multiplier",
    },
    COMPRESSED_TENSORS: {
        "weight_packed": "codes", "weight_scale": "scales", "weight_global_scale": "weight_divisor",
        "input_global_scale": "input_divisor",
    },
}  # fmt: skip


def detect(hf_dir: Path, config: dict[str, Any]) -> str | None:
    """The exporter of a pre-quantized NVFP4 checkpoint, None for a plain one; any other quantization config is
    refused (this converter would otherwise read its packed words as weights)."""
    quant = config.get("quantization_config") or config.get("text_config", {}).get("quantization_config")
    side = hf_dir / "hf_quant_config.json"
    if quant is None and side.exists():
        quant = {"quant_method": MODELOPT, **json.loads(side.read_text()).get("quantization", {})}
    if quant is None:
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == MODELOPT and str(quant.get("quant_algo", "")).upper() == "NVFP4":
        return MODELOPT
    if method == COMPRESSED_TENSORS and str(quant.get("format", "")) == "nvfp4-pack-quantized":
        return COMPRESSED_TENSORS
    raise ArtifactError(
        f"{hf_dir}: quantization_config {json.dumps(quant, sort_keys=True)[:200]} is not a supported source "
        "(convert reads bf16/fp32 checkpoints and NVFP4 from ModelOpt or compressed-tensors)"
    )


@dataclass(frozen=True)
class Words:
    """One linear's NVFP4 words: codes uint8 [N, K/2], natural E4M3 scale words uint8 [N, K/16], the weight
    divisor and the input divisor (None when the checkpoint has no input calibration)."""

    codes: torch.Tensor
    scales: torch.Tensor
    divisor: float
    input_divisor: float | None

    def dequantize(self) -> torch.Tensor:
        n = self.codes.shape[0]
        pairs = torch.stack([self.codes & 15, self.codes >> 4], dim=-1).reshape(n, -1).long()
        values = _E2M1[pairs & 7] * torch.where(pairs >= 8, -1.0, 1.0)
        scales = self.scales.view(torch.float8_e4m3fn).float().repeat_interleave(_BLOCK, dim=1)
        return values * scales / self.divisor


class PrequantSource:
    """The checkpoint's tensors by model name (``normalize_name``'d; loaders and header shapes): ``words(name)``
    for an NVFP4 linear's weight, ``dense(name)`` for any tensor as float (NVFP4 weights dequantized)."""

    def __init__(
        self, scheme: str, raw: Mapping[str, Callable[[], torch.Tensor]], shapes: dict[str, tuple[int, ...]]
    ) -> None:
        self.scheme = scheme
        self._shapes = shapes
        self._plain: dict[str, Callable[[], torch.Tensor]] = {}
        self._quant: dict[str, dict[str, Callable[[], torch.Tensor]]] = {}
        suffixes = _SUFFIXES[scheme]
        for name, load in raw.items():
            base, _, leaf = name.rpartition(".")
            if leaf in suffixes and leaf != "weight":
                self._quant.setdefault(base + ".weight", {})[suffixes[leaf]] = load
        for name, load in raw.items():
            base, _, leaf = name.rpartition(".")
            if leaf == "weight" and name in self._quant:
                self._quant[name]["codes"] = load
            elif leaf == "weight_packed":
                self._quant.setdefault(base + ".weight", {})["codes"] = load
            elif leaf == "weight" or leaf not in suffixes:
                self._plain[name] = load
        for name, parts in self._quant.items():
            missing = {"codes", "scales"} - set(parts)
            if missing or not ({"weight_multiplier", "weight_divisor"} & set(parts)):
                raise ArtifactError(
                    f"{name}: a {scheme} NVFP4 linear without its {sorted(missing) or 'global scale'}"
                )

    def names(self) -> list[str]:
        return sorted([*self._plain, *self._quant])

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._quant:
            codes = name.removesuffix(".weight") + (
                ".weight" if self.scheme == MODELOPT else ".weight_packed"
            )
            n, half = self._shapes[codes]
            return (n, 2 * half)
        return self._shapes[name]

    def is_quantized(self, name: str) -> bool:
        return name in self._quant

    def words(self, name: str) -> Words:
        parts = {role: load() for role, load in self._quant[name].items()}
        codes, scales = parts["codes"], parts["scales"]
        if codes.dtype != torch.uint8 or codes.dim() != 2:
            raise ArtifactError(
                f"{name}: NVFP4 codes must be uint8 [N, K/2], got {codes.dtype} {list(codes.shape)}"
            )
        n, half = codes.shape
        if scales.dtype not in (torch.float8_e4m3fn, torch.uint8) or tuple(scales.shape) != (
            n,
            2 * half // _BLOCK,
        ):
            raise ArtifactError(
                f"{name}: NVFP4 scales must be float8_e4m3fn [{n}, {2 * half // _BLOCK}], "
                f"got {scales.dtype} {list(scales.shape)}"
            )
        if "weight_multiplier" in parts:
            divisor = 1.0 / float(parts["weight_multiplier"].float().reshape(-1)[0])
        else:
            divisor = float(parts["weight_divisor"].float().reshape(-1)[0])
        input_divisor = None
        if "input_multiplier" in parts:
            input_divisor = 1.0 / float(parts["input_multiplier"].float().reshape(-1)[0])
        elif "input_divisor" in parts:
            input_divisor = float(parts["input_divisor"].float().reshape(-1)[0])
        if not (divisor > 0 and divisor != float("inf")):
            raise ArtifactError(f"{name}: NVFP4 weight divisor {divisor} must be finite and positive")
        return Words(codes.contiguous(), scales.contiguous().view(torch.uint8), divisor, input_divisor)

    def dense(self, name: str) -> torch.Tensor:
        if name in self._quant:
            return self.words(name).dequantize()
        return self._plain[name]()


class NotQuantized(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """A child of the requested object is stored unquantized: the object is encoded from dense values."""


@dataclass(frozen=True)
class SpecWords:
    codes: torch.Tensor
    scales: torch.Tensor
    divisor: float
    input_divisor: float | None
    rescaled_rows: int  # rows whose scale words were re-rounded to share the parent's divisor (0: bit-exact)


def _f32_bytes(value: float, rows: int) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32).view(torch.uint8).expand(rows, 4)


def spec_words(spec: TensorSpec, source: PrequantSource, config: ModelConfig) -> SpecWords:
    """The NVFP4 words of one profile object, gathered from its children's words (see the module docstring).
    Raises NotQuantized when a child is stored unquantized."""
    rows, k = spec.shape
    half, groups = k // 2, k // _BLOCK

    @functools.cache  # an object's rows can come from one child several times (splits, interleaves)
    def bundle(name: str) -> torch.Tensor:
        if not source.is_quantized(name):
            raise NotQuantized(name)
        w = source.words(name)
        n = w.codes.shape[0]
        no_input = float("nan") if w.input_divisor is None else w.input_divisor
        return torch.cat([w.codes, w.scales, _f32_bytes(w.divisor, n), _f32_bytes(no_input, n)], dim=1)

    width = half + groups + 8
    gathered = source_tensor(dataclasses.replace(spec, shape=(rows, width)), bundle, config)
    codes, scales = gathered[:, :half], gathered[:, half : half + groups]
    divisors = gathered[:, half + groups : half + groups + 4].contiguous().view(torch.float32)[:, 0]
    inputs = gathered[:, half + groups + 4 :].contiguous().view(torch.float32)[:, 0]
    divisor = float(divisors.min())
    rescaled = divisors != divisor
    if bool(rescaled.any()):
        factor = (divisor / divisors[rescaled])[:, None]
        old = scales[rescaled].view(torch.float8_e4m3fn).float()
        scales = scales.clone()
        scales[rescaled] = (old * factor).to(torch.float8_e4m3fn).view(torch.uint8)
    known = inputs[~inputs.isnan()]
    return SpecWords(
        codes.contiguous(),
        scales.contiguous(),
        divisor,
        float(known.min()) if known.numel() else None,
        int(rescaled.sum()),
    )
