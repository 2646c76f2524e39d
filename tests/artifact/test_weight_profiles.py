"""The weight profiles reproduce the published files: object counts, byte sizes and per-format totals."""

from __future__ import annotations

import json

import pytest

from engine.artifact import formats
from engine.artifact.cli import main
from engine.artifact.profiles import PROFILES, REAL_CONFIGS, TensorSpec, plan_profile, profile_for
from engine.artifact.registry import PUBLISHED

# object counts of the published files (issue #17; upstream's inventory proofs and v2->v3 upgrade tool)
PUBLISHED_OBJECTS = {
    "qwen3.6-27b/groupwise-int": 1124,
    "qwen3.6-27b/nvfp4": 1307,
    "qwen3.8-27b/groupwise-int": 1124,
    "qwen3.8-27b/nvfp4": 1124,
    "qwen3.6-35b-a3b/groupwise-int": 940,
}


def test_every_published_identity_has_a_profile():
    assert set(PROFILES) == {entry.key for entry in PUBLISHED} == set(PUBLISHED_OBJECTS)


@pytest.mark.parametrize("entry", PUBLISHED, ids=lambda e: e.key)
def test_plan_reproduces_the_published_file(entry):
    layout = plan_profile(PROFILES[entry.key])
    assert len(layout.objects) == PUBLISHED_OBJECTS[entry.key]
    assert layout.file_bytes == entry.size_bytes, (
        f"{entry.key}: {layout.file_bytes - entry.size_bytes:+,} bytes"
    )


def test_payload_sizes_of_the_issue_examples():
    assert formats.encoded_bytes([128, 64], "NVFP4", formats.BLOCKSCALE) == 4612
    assert formats.encoded_bytes([128, 128], "Q4G64_F16S", formats.ROW_SPLIT) == 8704
    assert formats.encoded_bytes([128, 64], "FP8_E4M3FN_ROW_BF16S", formats.ROW_SCALE) == 8448
    with pytest.raises(ValueError, match="multiple of 128"):
        formats.encoded_bytes([64, 64], "NVFP4", formats.BLOCKSCALE)


def _formats(key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for spec in PROFILES[key].objects():
        if isinstance(spec, TensorSpec):
            counts[spec.format] = counts.get(spec.format, 0) + 1
    return counts


def test_per_role_allocation_counts():
    # upstream's inventory proofs (27B groupwise section 9.2; the fused NVFP4 recipe's closed counts)
    assert _formats("qwen3.6-27b/groupwise-int") == {
        "BF16": 582, "FP32": 96, "I32": 1, "Q4G64_F16S": 183, "Q5G64_F16S": 246, "Q6G64_F16S": 3, "W8G32_F16S": 7,
    }  # fmt: skip
    assert _formats("qwen3.6-27b/nvfp4") == {
        "BF16": 591, "FP32": 343, "I32": 1, "Q4G64_F16S": 55, "Q5G64_F16S": 54, "Q6G64_F16S": 1, "W8G32_F16S": 9,
        "NVFP4": 247,
    }  # fmt: skip
    mixed = PROFILES["qwen3.8-27b/nvfp4"].objects()
    nvfp4 = [s.name for s in mixed if isinstance(s, TensorSpec) and s.format == "NVFP4"]
    assert len(nvfp4) == 2 * 56 and all("/mlp/" in n and int(n.split("/")[2]) < 56 for n in nvfp4)
    divisors = [s.name for s in mixed if s.name.endswith("/input_scale_divisor")]
    assert len(divisors) == len(nvfp4)


def test_35b_routed_bytes_match_the_upstream_table():
    totals = plan_profile(PROFILES["qwen3.6-35b-a3b/groupwise-int"]).tensor_bytes_by_format()
    # upstream's 35B-A3B artifact reference, section 9.3 (the quantized formats DFlash does not use)
    assert totals["Q4G64_F16S"] == 11_679_339_456
    assert totals["Q5G64_F16S"] == 6_630_296_064
    assert totals["Q6G64_F16S"] == 1_027_840_000


@pytest.mark.parametrize("key", sorted(PROFILES))
def test_fused_parents_cover_their_rows(key):
    for spec in PROFILES[key].objects():
        if isinstance(spec, TensorSpec) and spec.outputs:
            assert sum(rows for _, rows in spec.outputs) == spec.shape[0], spec.name


def test_profile_for_resolves_published_and_development_identities():
    assert profile_for("qwen3.6-27b", "nvfp4") is PROFILES["qwen3.6-27b/nvfp4"]
    assert profile_for("ninfer-tiny-dense", "groupwise-int") is PROFILES["qwen3.6-27b/groupwise-int"]
    assert (
        profile_for("ninfer-tiny-moe", "groupwise-int", moe=True) is PROFILES["qwen3.6-35b-a3b/groupwise-int"]
    )
    assert profile_for("ninfer-tiny-dense", "bf16") is None
    assert REAL_CONFIGS["qwen3.8-27b"] == REAL_CONFIGS["qwen3.6-27b"]


def test_cli_plan_prints_the_inventory_and_size(capsys):
    assert main(["plan", "--profile", "qwen3.6-35b-a3b/groupwise-int"]) == 0
    out = capsys.readouterr().out
    assert "940 objects" in out and "file 22,783,246,080 bytes" in out
    assert "text/layers/39/moe/routed_down" in out
    assert main(["plan", "--profile", "qwen3.6-27b/groupwise-int", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["objects"], info["file_bytes"]) == (1124, 17_495_365_888)
    parent = next(o for o in info["inventory"] if o["name"] == "text/layers/0/gdn/value_z")
    assert parent["format"] == "Q5G64_F16S" and parent["outputs"] == [["value", 6144], ["z", 6144]]


def test_cli_plan_refuses_an_unknown_profile(capsys):
    assert main(["plan", "--profile", "qwen3.6-27b/int3"]) == 2
    assert "unknown profile" in capsys.readouterr().err
