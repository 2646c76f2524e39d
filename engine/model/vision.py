"""The Qwen3.5 vision tower: patches of images and video frames -> embeddings of the text width.

Pipeline (sizes for the 27B checkpoint; every size is read from the checkpoint's ``vision_config``):

1. patch embedding: each patch is ``C x temporal_patch x patch x patch`` pixels (3 x 2 x 16 x 16, flattened
   by the preprocessor in that order) -> ``hidden`` (1152) by one GEMM with the checkpoint's Conv3d weight
   viewed as a matrix (kernel == stride, so the convolution is exactly a matmul), plus its bias;
2. learned absolute positions: a ``side x side`` table (48 x 48) resampled bilinearly (align-corners) to each
   image's patch grid ``(h, w)`` and added; the same for every frame of a video;
3. ``depth`` (27) pre-LayerNorm blocks: bidirectional attention (16 heads x 72) with 2D rotary positions
   (row, column of the patch; a quarter of the head each, repeated as rotate-half pairs) over one segment
   per image frame (patches never attend across images or frames), then a GELU(tanh) MLP;
4. merger: LayerNorm, then each 2 x 2 block of neighbouring patches concatenated (4 x 1152) -> GELU MLP ->
   ``out_hidden_size`` (the text model's hidden size). One output row per merged block: an image of
   ``t x h x w`` patches yields ``t * h * w / 4`` embeddings, which replace its placeholder tokens.

Patch order: the preprocessor emits each frame's patches in *merge-block order* (block row, block column,
row within block, column within block), so the four patches of a merged token are consecutive rows and the
merger is a plain reshape. Positions (learned and rotary) are generated in that same order here.

Parameter names mirror the checkpoint's ``model.visual.*`` tensors (``patch_embed.proj``, ``pos_embed``,
``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.linear_fc1,mlp.linear_fc2}``, ``merger.{norm,linear_fc1,
linear_fc2}``) so a state dict loads by name. Attention is ``segmented_attention``: SDPA per group of
equal-length segments on every device today (a varlen kernel for the GPU is the follow-up).

``build_vision_tower`` loads the tower from a checkpoint's tensors (strict name and shape check);
``splice_media`` puts its output rows at the placeholder tokens' embeddings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's geometry and the multimodal token ids, from a composite HF config dict."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    hidden_act: str
    rope_theta: float
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"vision_config: hidden_size {self.hidden_size} not divisible by {self.num_heads} heads"
            )
        if self.head_dim % 4:
            raise ValueError(f"vision_config: head_dim {self.head_dim} must be a multiple of 4 (2D rotary)")
        side = round(self.num_position_embeddings**0.5)
        if side * side != self.num_position_embeddings:
            raise ValueError(
                f"vision_config: num_position_embeddings {self.num_position_embeddings} is not a square"
            )
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(
                f"vision_config: hidden_act {self.hidden_act!r} unsupported ({sorted(_ACTIVATIONS)})"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def position_side(self) -> int:
        return round(self.num_position_embeddings**0.5)

    @property
    def patch_dim(self) -> int:
        """Pixels per patch row of ``pixel_values``: C * temporal_patch * patch * patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> VisionConfig:
        """From the composite ``config.json`` (``vision_config`` plus the top-level token ids)."""
        vision = config.get("vision_config")
        if not isinstance(vision, dict):
            raise ValueError("config has no vision_config: not a vision-language checkpoint")
        rope = vision.get("rope_parameters") or {}

        def size(name: str, default: int) -> int:
            value = vision.get(name, default)
            if isinstance(value, (list, tuple)):  # patch sizes may be given per axis; ours are square
                if len(set(value)) != 1:
                    raise ValueError(f"vision_config.{name} {value}: only equal sizes are supported")
                value = value[0]
            return int(value)

        return cls(
            depth=int(vision.get("depth", 27)),
            hidden_size=int(vision.get("hidden_size", 1152)),
            intermediate_size=int(vision.get("intermediate_size", 4304)),
            num_heads=int(vision.get("num_heads", 16)),
            in_channels=int(vision.get("in_channels", 3)),
            patch_size=size("patch_size", 16),
            temporal_patch_size=size("temporal_patch_size", 2),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            out_hidden_size=int(vision.get("out_hidden_size", 3584)),
            num_position_embeddings=int(vision.get("num_position_embeddings", 2304)),
            hidden_act=str(vision.get("hidden_act", "gelu_pytorch_tanh")),
            rope_theta=float(rope.get("rope_theta") or vision.get("rope_theta") or 10000.0),
            image_token_id=int(config.get("image_token_id", 248056)),
            video_token_id=int(config.get("video_token_id", 248057)),
            vision_start_token_id=int(config.get("vision_start_token_id", 248053)),
            vision_end_token_id=int(config.get("vision_end_token_id", 248054)),
        )


def _grids(grid_thw: torch.Tensor) -> list[tuple[int, int, int]]:
    return [(int(t), int(h), int(w)) for t, h, w in grid_thw.tolist()]


def merge_block_order(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each patch of an ``h x w`` frame, listed in merge-block order."""
    if h % merge or w % merge:
        raise ValueError(f"patch grid {h}x{w} is not a multiple of the spatial merge size {merge}")
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
    return rows.transpose(1, 2).reshape(-1), cols.transpose(1, 2).reshape(-1)


def interpolate_positions(table: torch.Tensor, grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """The ``side x side`` learned table [side*side, D] resampled bilinearly (align-corners) to every
    frame's patch grid, in merge-block order, repeated over frames: [sum(t*h*w), D]."""
    side = round(table.shape[0] ** 0.5)
    out = []
    for t, h, w in _grids(grid_thw):
        rows, cols = merge_block_order(h, w, merge)
        acc = torch.zeros(rows.numel(), table.shape[1], dtype=torch.float32, device=table.device)
        for taps_r, weight_r in _taps(rows, h, side):
            for taps_c, weight_c in _taps(cols, w, side):
                index = (taps_r * side + taps_c).to(table.device)
                acc += table[index].float() * (weight_r * weight_c).to(table.device)[:, None]
        out.append(acc.to(table.dtype).repeat(t, 1))
    return torch.cat(out)


def _taps(index: torch.Tensor, size: int, side: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The two source taps of a bilinear align-corners resample of ``side`` points onto ``size``."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    low = src.floor()
    frac = src - low
    low_i = low.long()
    high_i = (low_i + 1).clamp(max=side - 1)
    return [(low_i, 1 - frac), (high_i, frac)]


def rotary_cos_sin(
    grid_thw: torch.Tensor, merge: int, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """2D rotary angles per patch, [N, head_dim] each (float32): the first half of the head rotates by the
    patch row (first quarter) and column (second quarter), and the second half repeats it (rotate-half)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float32) / (head_dim // 2)))
    rows, cols = [], []
    for t, h, w in _grids(grid_thw):
        r, c = merge_block_order(h, w, merge)
        rows.append(r.repeat(t))
        cols.append(c.repeat(t))
    row, col = torch.cat(rows).float(), torch.cat(cols).float()
    half = torch.cat([row[:, None] * inv_freq, col[:, None] * inv_freq], dim=-1)
    angles = torch.cat([half, half], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary on [N, heads, D] with [N, D] angles, in float32, back in ``x``'s dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def segment_lengths(grid_thw: torch.Tensor) -> list[int]:
    """Attention segments: one per frame of each image/video (``h * w`` patches each), in order."""
    return [h * w for t, h, w in _grids(grid_thw) for _ in range(t)]


def segmented_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]
) -> torch.Tensor:
    """Bidirectional attention within each segment of the packed rows; q, k, v and the result [N, H, D].

    Segments of equal length (a video's frames, same-size images) run as one batched SDPA call."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    if starts[-1] != q.shape[0]:
        raise ValueError(f"segment lengths sum to {starts[-1]}, but there are {q.shape[0]} rows")
    if len(set(lengths)) == 1:  # one image, or a video's frames: a plain reshape, no gather

        def split(x: torch.Tensor, n: int = lengths[0]) -> torch.Tensor:
            return x.view(-1, n, x.shape[1], x.shape[2]).transpose(1, 2)  # [S, H, n, D]

        o = F.scaled_dot_product_attention(split(q), split(k), split(v))
        return o.transpose(1, 2).reshape(q.shape)
    out = torch.empty_like(q)
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(starts[i])
    for n, begins in by_length.items():
        index = (torch.tensor(begins)[:, None] + torch.arange(n)).reshape(-1).to(q.device)

        def gather(x: torch.Tensor, index: torch.Tensor = index, n: int = n) -> torch.Tensor:
            return x[index].view(-1, n, x.shape[1], x.shape[2]).transpose(1, 2)  # [S, H, n, D]

        o = F.scaled_dot_product_attention(gather(q), gather(k), gather(v))
        out[index] = o.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2])
    return out


class _Linear(nn.Module):
    """A dense linear layer with bias (every vision projection has one), ``F.linear``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class _Params(nn.Module):
    """Holds a ``weight`` (and optionally a ``bias``) under the checkpoint's names."""

    def __init__(self, weight_shape: tuple[int, ...], bias_size: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(weight_shape), requires_grad=False)
        self.bias = None if bias_size is None else nn.Parameter(torch.zeros(bias_size), requires_grad=False)


class PatchEmbed(nn.Module):
    """The checkpoint's Conv3d (kernel == stride == the patch) applied as one GEMM over flattened patches."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        p, tp = config.patch_size, config.temporal_patch_size
        self.proj = _Params((config.hidden_size, config.in_channels, tp, p, p), config.hidden_size)
        self.patch_dim = config.patch_dim

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        x = pixel_values.reshape(-1, self.patch_dim).to(weight.dtype)
        return F.linear(x, weight.reshape(weight.shape[0], -1), self.proj.bias)


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.qkv = _Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = _Linear(config.hidden_size, config.hidden_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)
        o = segmented_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, lengths)
        return self.proj(o.reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.approximate = _ACTIVATIONS[config.hidden_act]
        self.linear_fc1 = _Linear(config.hidden_size, config.intermediate_size)
        self.linear_fc2 = _Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.norm1 = _LayerNorm(config.hidden_size)
        self.norm2 = _LayerNorm(config.hidden_size)
        self.attn = VisionAttention(config)
        self.mlp = VisionMLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LayerNorm per patch, then each merge block's patches concatenated -> GELU MLP -> text width."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.merged_dim = config.hidden_size * config.merge_unit
        self.norm = _LayerNorm(config.hidden_size)
        self.linear_fc1 = _Linear(self.merged_dim, self.merged_dim)
        self.linear_fc2 = _Linear(self.merged_dim, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).view(-1, self.merged_dim)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTower(nn.Module):
    """``forward(pixel_values [N, patch_dim], grid_thw [M, 3]) -> [N / merge_unit, out_hidden_size]``.

    ``grid_thw`` rows are each medium's (temporal, height, width) grid in patches, in the order of the packed
    ``pixel_values``; output rows follow the same order, ``t * h * w / merge_unit`` per medium."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = _Params((config.num_position_embeddings, config.hidden_size))
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        grid_thw = grid_thw.cpu()
        expected = int(grid_thw.prod(-1).sum())
        if pixel_values.shape[0] != expected or pixel_values[0].numel() != cfg.patch_dim:
            raise ValueError(
                f"pixel_values {tuple(pixel_values.shape)} do not match grid_thw ({expected} patches of {cfg.patch_dim})"
            )
        x = self.patch_embed(pixel_values)
        x = x + interpolate_positions(self.pos_embed.weight, grid_thw, cfg.spatial_merge_size).to(x.dtype)
        cos, sin = rotary_cos_sin(grid_thw, cfg.spatial_merge_size, cfg.head_dim, cfg.rope_theta)
        cos, sin = cos.to(x.device), sin.to(x.device)
        lengths = segment_lengths(grid_thw)
        for block in self.blocks:
            x = block(x, cos, sin, lengths)
        return self.merger(x)

    def split_sizes(self, grid_thw: torch.Tensor) -> list[int]:
        """Output rows per medium (its number of placeholder tokens)."""
        return [t * h * w // self.config.merge_unit for t, h, w in _grids(grid_thw)]


VISION_PREFIX = "model.visual."


def build_vision_tower(
    config: VisionConfig, tensor_names: list[str], get: Callable[[str], torch.Tensor], dtype: torch.dtype
) -> VisionTower:
    """The tower with the checkpoint's ``model.visual.*`` tensors (names as ``save_pretrained`` writes them;
    ``model.visual.X`` or, in older layouts, ``visual.X``). Missing, unexpected or mis-shaped tensors raise
    ``ValueError`` naming them all."""
    tower = VisionTower(config)
    wanted = tower.state_dict()
    found: dict[str, str] = {}
    for name in tensor_names:
        for prefix in (VISION_PREFIX, "visual."):
            if name.startswith(prefix):
                found[name[len(prefix) :]] = name
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    problems = [f"missing {n}" for n in missing] + [f"unexpected {VISION_PREFIX}{n}" for n in unexpected]
    tensors = {}
    for short in sorted(set(wanted) & set(found)):
        tensor = get(found[short])
        if tuple(tensor.shape) != tuple(wanted[short].shape):
            problems.append(f"{short}: shape {tuple(tensor.shape)}, expected {tuple(wanted[short].shape)}")
        tensors[short] = tensor
    if problems:
        raise ValueError("vision tower weights do not match vision_config: " + "; ".join(problems[:20]))
    tower.load_state_dict(tensors, strict=True)
    return tower.to(dtype).eval()


def splice_media(embeds: torch.Tensor, is_media: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``embeds`` [T, H] with the rows at the placeholder tokens (``is_media`` [T] bool) replaced, in order,
    by the tower's output ``rows`` [M, H] (M must equal the number of placeholders)."""
    count = int(is_media.sum())
    if count != rows.shape[0]:
        raise ValueError(f"{count} placeholder tokens but {rows.shape[0]} media embeddings")
    out = embeds.clone()
    out[is_media] = rows.to(embeds.dtype)
    return out
