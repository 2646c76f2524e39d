"""The kernel switches have one reading: kernels/_dispatch.py parses NINFER_KERNELS and NINFER_GEMV once at
import, and engine/env.py (the list of every variable) reports those values rather than parsing again."""

from __future__ import annotations

import pytest

from engine import env
from kernels import _dispatch


def test_engine_env_reports_what_the_kernels_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_dispatch, "KERNELS_MODE", "ref")
    monkeypatch.setattr(_dispatch, "GEMV_MODE", "on")
    monkeypatch.setattr(_dispatch, "QUANT_GEMV_MODE", "packed")
    monkeypatch.setattr(_dispatch, "MOE_ROUTER_MODE", "fused")
    assert (env.kernels_mode(), env.gemv_mode(), env.quant_gemv_mode()) == ("ref", "on", "packed")
    monkeypatch.setattr(_dispatch, "SPLITK_REDUCE", "last")
    assert (env.moe_router_mode(), env.splitk_reduce_mode()) == ("fused", "last")
    monkeypatch.setattr(_dispatch, "QUANT_MOE_MODE", "v2")
    assert env.quant_moe_mode() == "v2"
    monkeypatch.setattr(_dispatch, "QUANT_MOE_SHARED", "separate")
    assert env.quant_moe_shared_mode() == "separate"
    monkeypatch.setattr(_dispatch, "MOE_PREFILL", "quant")
    assert env.moe_prefill_mode() == "quant"
    monkeypatch.setattr(_dispatch, "INT8_ATTENTION", "keys_major")
    assert env.int8_attention_mode() == "keys_major"
    monkeypatch.setattr(_dispatch, "FP_ONE_ROW", "ring")
    assert env.fp_one_row_mode() == "ring"


def test_kernel_switches_are_normalised_or_refused_with_the_variable_named() -> None:
    assert _dispatch.parse_kernels_mode(" REF ") == "ref" and _dispatch.parse_gemv_mode("Auto") == "auto"
    with pytest.raises(ValueError, match=r"^NINFER_KERNELS='fast': expected 'auto', 'ref', 'triton'$"):
        _dispatch.parse_kernels_mode("fast")
    with pytest.raises(ValueError, match=r"^NINFER_GEMV='1': expected 'auto', 'on', 'off'$"):
        _dispatch.parse_gemv_mode("1")
    assert _dispatch.parse_quant_gemv_mode(" Packed") == "packed"
    with pytest.raises(ValueError, match=r"^NINFER_QUANT_GEMV='on': expected 'stored', 'packed'$"):
        _dispatch.parse_quant_gemv_mode("on")
    assert _dispatch.parse_moe_router_mode(" Fused") == "fused"
    with pytest.raises(ValueError, match=r"^NINFER_MOE_ROUTER='on': expected 'split', 'fused'$"):
        _dispatch.parse_moe_router_mode("on")
    assert _dispatch.parse_splitk_reduce_mode("LAST ") == "last"
    with pytest.raises(ValueError, match=r"^NINFER_SPLITK_REDUCE='off': expected 'launch', 'last'$"):
        _dispatch.parse_splitk_reduce_mode("off")
    assert _dispatch.parse_quant_moe_mode(" V2") == "v2"
    with pytest.raises(ValueError, match=r"^NINFER_QUANT_MOE='v3': expected 'v1', 'v2'$"):
        _dispatch.parse_quant_moe_mode("v3")
    assert _dispatch.parse_moe_prefill_mode(" Quant") == "quant"
    with pytest.raises(ValueError, match=r"^NINFER_MOE_PREFILL='dense': expected 'scratch', 'quant'$"):
        _dispatch.parse_moe_prefill_mode("dense")
    assert _dispatch.parse_int8_attention_mode(" Keys_Major") == "keys_major"
    with pytest.raises(ValueError, match=r"^NINFER_INT8_ATTENTION='fast': expected 'grouped', 'keys_major'$"):
        _dispatch.parse_int8_attention_mode("fast")
    assert _dispatch.parse_fp_one_row_mode(" Ring") == "ring"
    with pytest.raises(ValueError, match=r"^NINFER_FP_ONE_ROW='on': expected 'rows', 'ring'$"):
        _dispatch.parse_fp_one_row_mode("on")


def test_gemv_variant_switches(monkeypatch):
    """NINFER_ONE_ROW / NINFER_FEW_ROWS / NINFER_W8_ONE_ROW: unset or blank is None (the measured tables), a name
    is kept, and env.gemv_variants() reports what kernels._dispatch parsed."""
    assert _dispatch.parse_gemv_variant(None) is None
    assert _dispatch.parse_gemv_variant("  ") is None
    assert _dispatch.parse_gemv_variant(" mma_n64 ") == "mma_n64"
    monkeypatch.setattr(_dispatch, "FEW_ROWS_VARIANT", "mma_n128")
    assert env.gemv_variants()["NINFER_FEW_ROWS"] == "mma_n128"


def test_attn_fuse_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """NINFER_ATTN_FUSE: off or on, normalised; anything else refused with the variable named; env reports it."""
    assert _dispatch.parse_attn_fuse_mode(" ON") == "on" and _dispatch.parse_attn_fuse_mode("off") == "off"
    with pytest.raises(ValueError, match=r"^NINFER_ATTN_FUSE='1': expected 'off', 'on'$"):
        _dispatch.parse_attn_fuse_mode("1")
    monkeypatch.setattr(_dispatch, "ATTN_FUSE", "on")
    assert env.attn_fuse_mode() == "on"


def test_rollback_copy_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """NINFER_ROLLBACK_COPY: gather or skip, normalised; anything else refused with the variable named; env reports
    it, and the launcher follows it unless told."""
    from kernels.state_copy import skips_own_slots

    assert _dispatch.parse_rollback_copy_mode(" SKIP") == "skip"
    with pytest.raises(ValueError, match=r"^NINFER_ROLLBACK_COPY='on': expected 'gather', 'skip'$"):
        _dispatch.parse_rollback_copy_mode("on")
    monkeypatch.setattr(_dispatch, "ROLLBACK_COPY", "gather")
    assert env.rollback_copy_mode() == "gather" and not skips_own_slots() and skips_own_slots(True)
    monkeypatch.setattr(_dispatch, "ROLLBACK_COPY", "skip")
    assert env.rollback_copy_mode() == "skip" and skips_own_slots() and not skips_own_slots(False)
