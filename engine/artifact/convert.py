"""`convert`: a Hugging Face Qwen3.5 / Qwen3.5-MoE checkpoint directory to a `.ninfer` artifact.

Plain weights ids keep tensor names and shapes exactly as in the checkpoint (a mapping, not a
transformation); the weights id decides only the storage dtype:
- `fp32`: floating tensors stored as FP32 (bit-exact for float32 checkpoints; used by the parity tests);
- `bf16`: floating tensors stored as BF16, except `A_log`, which the model reads in float32.

A weights id that names a weight profile (`groupwise-int`, `nvfp4`, `nvfp4-mixed`: `engine.artifact.profiles`)
writes that profile's inventory instead: every object built from the checkpoint (`profiles.hf_source`), the
quantized ones encoded by `kernels.quant.encode` (groupwise: upstream's canonical max-abs encoder; NVFP4 and
FP8 rows: ours). An NVFP4 site's input divisor is calibration this converter does not run: it writes 1.0
(the A16 paths never read it). A development identity (`ninfer-tiny-*`) gets the text tower and MTP block, and,
from a vision-language checkpoint (a `vision_config` and `model.visual.*` tensors), the vision tower at the
checkpoint's geometry (`vision/*`, each object in its profile format); the stored `config.json` keeps the
`vision_config` and media token ids the loader builds the tower by (and drops a `vision_config` the checkpoint
has no tower for). A published identity needs a complete checkpoint (its draft head is not built by this
converter yet), and is refused with the object it cannot source.
`--draft-head-frequencies FILE` (plain weights ids) adds the reduced output head of `--lm-head-draft`
(`text/draft_head` + `text/draft_head_token_ids`, engine/spec/draft_head.py) built from a frequency list.
Frontend files (tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json) are taken
from the directory when present; missing ones are filled with NInfer's Qwen3.5 defaults, and the command says
which. Tensors are streamed one at a time, so converting a 55 GB checkpoint does not hold it in memory.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.artifact.container import ArtifactError, LazyTensor, write_artifact

WEIGHT_PROFILES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FRONTEND_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
_DTYPES = {
    "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32,
    "F64": torch.float64, "I64": torch.int64,
}  # fmt: skip
_KEEP_FP32_SUFFIXES = ("A_log",)


def _load_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ArtifactError(f"{hf_dir}: no config.json (expected a Hugging Face checkpoint directory)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON: {exc}") from None
    from engine.model.config import ModelConfig

    try:
        ModelConfig.from_hf(config)
    except ValueError as exc:
        raise ArtifactError(f"{path}: not a supported Qwen3.5-family config: {exc}") from None
    return config


def _safetensors_files(hf_dir: Path) -> list[Path]:
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ArtifactError(f"{hf_dir}: no *.safetensors files")
    return files


def _storage_dtype(name: str, source: torch.dtype, profile: torch.dtype) -> torch.dtype:
    if not source.is_floating_point:
        if source == torch.int64:
            return torch.int32
        return source
    if name.endswith(_KEEP_FP32_SUFFIXES) and source == torch.float32:
        return torch.float32
    return profile


def _lazy_tensors(files: list[Path], profile: torch.dtype) -> list[tuple[str, LazyTensor]]:
    out: dict[str, LazyTensor] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name in out:
                    raise ArtifactError(f"{file.name}: tensor {name!r} appears in more than one shard")
                sl = f.get_slice(name)
                source = _DTYPES.get(sl.get_dtype())
                if source is None:
                    raise ArtifactError(
                        f"{file.name}: tensor {name!r} has unsupported dtype {sl.get_dtype()}"
                    )
                dtype = _storage_dtype(name, source, profile)

                def load(file: Path = file, name: str = name, dtype: torch.dtype = dtype) -> torch.Tensor:
                    with safe_open(file, framework="pt") as g:
                        return g.get_tensor(name).to(dtype).contiguous()

                out[name] = LazyTensor(tuple(sl.get_shape()), dtype, load)
    return sorted(out.items())


def frontend_resources(config: dict[str, Any], *, moe: bool) -> list[tuple[str, bytes]]:
    """config.json plus the Qwen3.5 tokenizer, tokenizer config, chat template and generation defaults."""
    from engine.chat.qwen35 import (
        build_qwen35_tokenizer_json,
        qwen35_chat_template,
        qwen35_generation_config,
        qwen35_tokenizer_config,
    )

    def as_json(obj: Any) -> bytes:
        return json.dumps(obj, indent=2, sort_keys=True).encode("utf-8")

    return [
        ("config.json", as_json(config)),
        ("tokenizer.json", build_qwen35_tokenizer_json()),
        ("tokenizer_config.json", as_json(qwen35_tokenizer_config())),
        ("chat_template.jinja", qwen35_chat_template().encode("utf-8")),
        ("generation_config.json", as_json(qwen35_generation_config(moe=moe))),
    ]


def _frontend_resources(hf_dir: Path, config: dict[str, Any]) -> tuple[list[tuple[str, bytes]], list[str]]:
    moe = "moe" in str(config.get("model_type", ""))
    defaults = dict(frontend_resources(config, moe=moe))
    resources: list[tuple[str, bytes]] = [("config.json", defaults.pop("config.json"))]
    filled = []
    for name in FRONTEND_FILES:
        path = hf_dir / name
        if path.is_file():
            resources.append((name, path.read_bytes()))
        else:
            resources.append((name, defaults[name]))
            filled.append(name)
    return resources, filled


QUANTIZED_WEIGHTS_IDS = ("groupwise-int", "nvfp4", "nvfp4-mixed")
_VISUAL_PREFIXES = ("model.visual.", "visual.")


def _profile_tensors(
    files: list[Path], config: dict[str, Any], model_id: str, weights_id: str
) -> list[tuple[str, Any]]:
    """The objects of ``weights_id``'s profile, built from the checkpoint and encoded (see the module docstring)."""
    from engine.artifact.container import EncodedTensor
    from engine.artifact.profiles import TensorSpec, profile_for, vision_geometry
    from engine.artifact.profiles.hf_source import source_tensor, vision_tensor
    from engine.artifact.profiles.prequant import NotQuantized, PrequantSource, detect, spec_words
    from engine.model.config import ModelConfig
    from engine.model.weights import check_inventory, collect_weights, is_skipped, normalize_name
    from kernels.quant import encode
    from kernels.quant.codec import pack_nvfp4
    from kernels.quant.formats import NVFP4

    model_config = ModelConfig.from_hf(config)
    profile = profile_for(model_id, weights_id, moe=model_config.is_moe)
    if profile is None:
        raise ArtifactError(f"{model_id}/{weights_id}: no weight profile for this identity")
    handles, shapes = {}, {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                handles[name] = file
                shapes[normalize_name(name)] = tuple(f.get_slice(name).get_shape())

    def get_tensor(name: str) -> torch.Tensor:
        with safe_open(handles[name], framework="pt") as f:
            return f.get_tensor(name)

    has_mtp = any(normalize_name(name).startswith("mtp.") for name in handles)
    visual = {name.split("visual.", 1)[1]: name for name in handles if name.startswith(_VISUAL_PREFIXES)}
    vision = vision_geometry(config) if visual else None
    if vision is None:  # the stored config says so: its inventory has no vision/ objects
        config.pop("vision_config", None)
    scheme = detect(files[0].parent, config)
    source: PrequantSource | None = None
    if scheme is None:
        tensors = collect_weights(handles, get_tensor, model_config, with_mtp=has_mtp)
        get = tensors.__getitem__
    else:
        if model_config.is_moe:
            raise ArtifactError(f"{model_id}: pre-quantized ({scheme}) MoE checkpoints are not supported")
        raw = {normalize_name(n): functools.partial(get_tensor, n) for n in handles}
        source = PrequantSource(scheme, raw, shapes)
        kept = [n for n in source.names() if not is_skipped(n, model_config, has_mtp)]
        check_inventory({n: source.shape(n) for n in kept}, model_config, has_mtp)
        get = source.dense
    out: list[tuple[str, Any]] = []
    copied = rescaled = 0
    reencoded: list[str] = []
    input_divisor: float | None = None
    for spec in profile.objects(model_config, vision):
        if not isinstance(spec, TensorSpec) or (spec.name.startswith("mtp/") and not has_mtp):
            continue
        if spec.name.endswith("/input_scale_divisor"):
            out.append((spec.name, torch.tensor(input_divisor or 1.0, dtype=torch.float32)))
            continue
        input_divisor = None
        if source is not None and spec.format == NVFP4:
            try:
                words = spec_words(spec, source, model_config)
            except NotQuantized:
                pass
            except KeyError as exc:
                raise ArtifactError(f"{model_id}/{weights_id}: {exc.args[0]}") from None
            else:
                data = pack_nvfp4(words.codes, words.scales, words.divisor).numpy().tobytes()
                out.append((spec.name, EncodedTensor(spec.shape, spec.format, spec.layout, data)))
                input_divisor, copied, rescaled = (
                    words.input_divisor,
                    copied + 1,
                    rescaled + bool(words.rescaled_rows),
                )
                continue
        try:
            if spec.name.startswith("vision/"):
                value = vision_tensor(spec, lambda short: get_tensor(visual[short]))
            else:
                value = source_tensor(spec, get, model_config)
        except KeyError as exc:
            raise ArtifactError(f"{model_id}/{weights_id}: {exc.args[0]}") from None
        if spec.quantized:
            if source is not None:
                reencoded.append(spec.name)
            data = encode(spec.format, value.float()).numpy().tobytes()
            out.append((spec.name, EncodedTensor(spec.shape, spec.format, spec.layout, data)))
        else:
            out.append(
                (
                    spec.name,
                    value.to({"BF16": torch.bfloat16, "FP32": torch.float32}.get(spec.format, value.dtype)),
                )
            )
    if source is not None:
        print(
            f"convert: {scheme} NVFP4 words copied into {copied} objects ({rescaled} of them with scale words "
            f"re-rounded to a shared divisor); {len(reencoded)} quantized objects encoded from dense values"
            + (f" ({', '.join(reencoded[:4])}{', ...' if len(reencoded) > 4 else ''})" if reencoded else ""),
            file=sys.stderr,
        )
    return out


def _draft_head_tensors(
    tensors: list[tuple[str, Any]],
    config: dict[str, Any],
    frequencies: str | os.PathLike[str],
    weights_id: str,
) -> list[tuple[str, Any]]:
    """`--draft-head-frequencies`: the reduced output head of `--lm-head-draft` (engine/spec/draft_head.py)
    from the checkpoint's output head (the embedding when tied) and a frequency list."""
    from engine.spec.draft_head import DRAFT_HEAD, DRAFT_HEAD_TOKEN_IDS, build_draft_head, read_frequency_list

    if weights_id not in WEIGHT_PROFILES:
        raise ArtifactError(
            f"--draft-head-frequencies: weights id {weights_id!r} stores a weight profile; this converter builds "
            f"the draft head for {sorted(WEIGHT_PROFILES)} only"
        )
    text = config.get("text_config", config)
    names = ["lm_head.weight"] if not text.get("tie_word_embeddings") else []
    names += ["model.language_model.embed_tokens.weight", "model.embed_tokens.weight"]
    by_name = dict(tensors)
    source = next((by_name[n] for n in names if n in by_name), None)
    if source is None:
        raise ArtifactError(f"--draft-head-frequencies: the checkpoint has none of {names}")
    head = source.load() if isinstance(source, LazyTensor) else source
    weight, ids = build_draft_head(head, read_frequency_list(frequencies))
    return [(DRAFT_HEAD, weight.to(WEIGHT_PROFILES[weights_id])), (DRAFT_HEAD_TOKEN_IDS, ids)]


def convert(
    hf_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    model_id: str,
    weights_id: str,
    draft_head_frequencies: str | os.PathLike[str] | None = None,
) -> Path:
    """`draft_head_frequencies`: also write the `--lm-head-draft` head built from this frequency list."""
    hf_dir = Path(hf_dir)
    if weights_id not in WEIGHT_PROFILES and weights_id not in QUANTIZED_WEIGHTS_IDS:
        raise ArtifactError(
            f"weights_id {weights_id!r}: convert supports {sorted(WEIGHT_PROFILES) + list(QUANTIZED_WEIGHTS_IDS)}"
        )
    from engine.artifact.registry import lookup

    entry = lookup(model_id, weights_id)
    if entry is None:
        raise ArtifactError(
            f"identity {model_id}/{weights_id} is not registered; the server would refuse the file"
        )
    config = _load_config(hf_dir)
    tensors: list[tuple[str, Any]]
    if weights_id in WEIGHT_PROFILES:
        from engine.artifact.profiles.prequant import detect

        scheme = detect(hf_dir, config)
        if scheme is not None:
            raise ArtifactError(
                f"{hf_dir} is a pre-quantized ({scheme}) NVFP4 checkpoint: convert it to its quantized profile "
                "(--weights-id nvfp4 or nvfp4-mixed); its packed words are not bf16 weights"
            )
        tensors = list(_lazy_tensors(_safetensors_files(hf_dir), WEIGHT_PROFILES[weights_id]))
    else:
        tensors = _profile_tensors(_safetensors_files(hf_dir), config, model_id, weights_id)
        if not any(name.startswith("mtp/") for name, _ in tensors):  # a checkpoint without the MTP head
            text = config.get("text_config", config)
            text["mtp_num_hidden_layers"] = 0  # the stored config says so: its inventory has no mtp/ objects
    if draft_head_frequencies is not None:
        tensors += _draft_head_tensors(tensors, config, draft_head_frequencies, weights_id)
    resources, filled = _frontend_resources(hf_dir, config)
    if filled:
        print(
            f"convert: {hf_dir} has no {', '.join(filled)}; using NInfer's Qwen3.5 defaults", file=sys.stderr
        )
    return write_artifact(out, model_id=model_id, weights_id=weights_id, tensors=tensors, resources=resources)
