"""`ninfer-artifact {build-tiny,convert,inspect,verify,migrate,plan}`: the artifact toolchain.

Exit codes: 0 success; 1 the check failed (digest mismatch, invalid or unregistered file); 2 usage errors
(argparse) and nothing to check against.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.artifact.container import ArtifactError, read_directory


def _summary(path: Path) -> dict[str, Any]:
    from engine.artifact.registry import lookup

    directory = read_directory(path)
    entry = lookup(directory.model_id, directory.weights_id) if directory.version == 2 else None
    info: dict[str, Any] = {
        "path": str(path),
        "file_bytes": path.stat().st_size,
        "container_version": directory.version,
        "identity": {"model_id": directory.model_id, "weights_id": directory.weights_id},
        "registered": entry is not None,
        "development": bool(entry and entry.development),
        "payload_offset": directory.payload_offset,
        "num_tensors": len(directory.tensors),
        "num_resources": len(directory.resources),
        "tensor_bytes": sum(t.bytes for t in directory.tensors),
        "resource_bytes": sum(r.bytes for r in directory.resources),
        "formats": sorted({f"{t.format}/{t.layout}" for t in directory.tensors}),
        "resources": [r.name for r in directory.resources],
    }
    if "config.json" in info["resources"]:
        from engine.artifact.container import Artifact

        with Artifact(path) as artifact:
            info["config"] = _config_summary(artifact.hf_config())
    return info


def _config_summary(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config", config)
    layer_types = text.get("layer_types") or []
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "num_experts", "num_experts_per_tok",
            "linear_num_key_heads", "linear_num_value_heads", "mtp_num_hidden_layers")  # fmt: skip
    out = {k: text[k] for k in keys if k in text}
    out["full_attention_layers"] = [i for i, t in enumerate(layer_types) if t == "full_attention"]
    return out


def _cmd_inspect(args: argparse.Namespace) -> int:
    info = _summary(Path(args.file))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    ident = info["identity"]
    status = (
        "development" if info["development"] else ("registered" if info["registered"] else "NOT registered")
    )
    print(f"{info['path']}: .ninfer v{info['container_version']}, {info['file_bytes']:,} bytes")
    print(f"  identity   {ident['model_id']}/{ident['weights_id']} ({status})")
    print(f"  objects    {info['num_tensors']} tensors ({info['tensor_bytes']:,} B), "
          f"{info['num_resources']} resources ({info['resource_bytes']:,} B)")  # fmt: skip
    print(f"  formats    {', '.join(info['formats'])}")
    for key, value in info.get("config", {}).items():
        print(f"  {key:<22} {value}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from engine.artifact.digest import is_sha256_hex, sha256_file
    from engine.artifact.registry import lookup

    path = Path(args.file)
    expected = args.sha256.lower() if args.sha256 else None
    if expected is not None and not is_sha256_hex(expected):
        print(f"verify: --sha256 must be 64 hex digits, got {args.sha256!r}", file=sys.stderr)
        return 2
    source = "--sha256"
    if expected is None:
        directory = read_directory(path)
        entry = lookup(directory.model_id, directory.weights_id)
        if entry is None or entry.sha256 is None:
            print(f"verify: {directory.model_id}/{directory.weights_id} has no published digest;"
                  " pass --sha256 HEX", file=sys.stderr)  # fmt: skip
            return 2
        expected, source = entry.sha256, f"registry entry {entry.key}"
    actual = sha256_file(path)
    print(f"{actual}  {path}")
    if actual != expected:
        print(
            f"verify: MISMATCH for {path}\n  expected {expected} ({source})\n  actual   {actual}",
            file=sys.stderr,
        )
        return 1
    print(f"verify: OK ({source})", file=sys.stderr)
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    from engine.artifact.migrate import migrate_v1_to_v2

    result = migrate_v1_to_v2(args.file, weights_id=args.weights_id)
    if result.already_v2:
        print(f"{result.path}: already v2 ({result.model_id}/{result.weights_id})")
    else:
        print(f"{result.path}: migrated to v2 as {result.model_id}/{result.weights_id} (payload untouched)")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from engine.artifact.convert import convert

    out = convert(
        args.hf_dir, args.out, model_id=args.model_id, weights_id=args.weights_id,
        draft_head_frequencies=args.draft_head_frequencies,
    )  # fmt: skip
    print(f"wrote {out} ({out.stat().st_size:,} bytes) as {args.model_id}/{args.weights_id}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from engine.artifact.profiles import PROFILES, TensorSpec, plan_profile

    profile = PROFILES.get(args.profile)
    if profile is None:
        print(f"plan: unknown profile {args.profile!r}; known: {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    layout = plan_profile(profile)
    if args.json:
        objects = [
            {"name": o.spec.name, "kind": "tensor", "shape": list(o.spec.shape), "format": o.spec.format,
             "layout": o.spec.layout, "offset": o.offset, "bytes": o.bytes,
             **({"outputs": [list(x) for x in o.spec.outputs]} if o.spec.outputs else {})}
            if isinstance(o.spec, TensorSpec) else {"name": o.spec.name, "kind": "resource"}
            for o in layout.objects
        ]  # fmt: skip
        info = {"profile": profile.key, "objects": len(layout.objects), "payload_offset": layout.payload_offset,
                "file_bytes": layout.file_bytes, "bytes_by_format": layout.tensor_bytes_by_format(),
                "inventory": objects}  # fmt: skip
        print(json.dumps(info, indent=1))
        return 0
    for obj in layout.objects:
        spec = obj.spec
        if isinstance(spec, TensorSpec):
            rows = (
                " [" + ", ".join(f"{n} {r}" for n, r in spec.outputs) + "]" if len(spec.outputs) > 1 else ""
            )
            shape = "x".join(map(str, spec.shape)) or "scalar"
            print(f"{obj.offset:>14,} {obj.bytes:>14,}  {spec.format:<20} {shape:<13} {spec.name}{rows}")
        else:
            print(f"{'':>14} {'':>14}  {'raw-bytes-v1':<20} {'':<13} {spec.name} (resources: one block)")
    print(f"{profile.key}: {len(layout.objects)} objects, payload at {layout.payload_offset:,},"
          f" file {layout.file_bytes:,} bytes (frontend resources {profile.resource_bytes:,} bytes in all)")  # fmt: skip
    for fmt, total in sorted(layout.tensor_bytes_by_format().items()):
        print(f"  {fmt:<22} {total:>16,} bytes")
    return 0


def _cmd_build_tiny(args: argparse.Namespace) -> int:
    if args.script is not None:
        return _build_scripted(args)
    from engine.testing.tiny import build_tiny  # an entry point: it may import engine.testing

    out = build_tiny(args.out, arch=args.arch, seed=args.seed)
    print(f"wrote {out} ({out.stat().st_size:,} bytes): tiny {args.arch} model, seed {args.seed}")
    return 0


def _build_scripted(args: argparse.Namespace) -> int:
    from engine.testing.script import Script, ScriptError, build_scripted

    if args.arch != "dense":
        print("build-tiny: --script builds the dense layout only (drop --arch moe)", file=sys.stderr)
        return 2
    try:
        script = Script.from_file(args.script)
        out = build_scripted(args.out, script, seed=args.seed)
    except ScriptError as exc:
        print(f"build-tiny: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({out.stat().st_size:,} bytes): scripted tiny model from {args.script}, verified")
    return 0


_SCRIPT_HELP = """\
a JSON file {"reasoning": "...", "content": "..."} ("reasoning" optional): build a model whose greedy output
is that script instead of random weights. After a thinking-on generation prompt it emits
reasoning + "\\n</think>\\n\\n" + content, after a thinking-off one the content, then <|im_end|>, whatever
the conversation before. Every run of 7 tokens in the output must be followed by one and the same token
(the model sees 7 tokens of context); the build decodes the model through the engine before it returns."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ninfer-artifact", description="Build, inspect and check .ninfer files."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="container version, identity, config summary, objects")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_inspect)
    p = sub.add_parser("verify", help="stream the file once and check its SHA-256")
    p.add_argument("file")
    p.add_argument("--sha256", help="expected digest (default: the registry entry of a published identity)")
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser("migrate", help="rewrite a v1 file's metadata as v2, in place")
    p.add_argument("file")
    p.add_argument("--weights-id", help="weights_id for a v1 model_id without a published one")
    p.set_defaults(func=_cmd_migrate)
    p = sub.add_parser("convert", help="a Hugging Face Qwen3.5 checkpoint directory to .ninfer")
    p.add_argument("hf_dir")
    p.add_argument("out")
    p.add_argument("--model-id", required=True)
    p.add_argument(
        "--weights-id", default="bf16", choices=["bf16", "fp32", "groupwise-int", "nvfp4", "nvfp4-mixed"],
        help="plain dtypes (bf16, fp32) or a weight profile, encoded by our encoder",
    )  # fmt: skip
    p.add_argument(
        "--draft-head-frequencies", metavar="FILE", default=None,
        help="also write the reduced output head of --lm-head-draft (131,072 rows) from this frequency list: "
        "token ids, most frequent first (a JSON list or whitespace-separated); plain weights ids only",
    )  # fmt: skip
    p.set_defaults(func=_cmd_convert)
    p = sub.add_parser("plan", help="a weight profile's full inventory (offsets, formats) and file size")
    p.add_argument("--profile", required=True, metavar="MODEL/WEIGHTS", help="e.g. qwen3.6-27b/groupwise-int")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_plan)
    p = sub.add_parser("build-tiny", help="a small random-weight model of the Qwen3.5 family layout")
    p.add_argument("out")
    p.add_argument("--arch", choices=["dense", "moe"], default="dense")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--script", metavar="FILE", help=_SCRIPT_HELP)
    p.set_defaults(func=_cmd_build_tiny)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ArtifactError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"ninfer-artifact {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
