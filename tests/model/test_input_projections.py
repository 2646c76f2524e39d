"""``InputProjections`` (engine/model/linear.py): a module's input projections bound once, read as views.

Pure CPU, tiny shapes: what each group comes back as (a view of one GEMM's output when its names are adjacent
columns of one parent, a concatenation across parents), the bound plan following ``input_projections``, and
refusals at bind time."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.model.linear import InputProjections, Linear, bound_inputs


def _layer(outputs: list[tuple[str, int]], k: int = 8, seed: int = 0) -> Linear:
    layer = Linear(k, sum(n for _, n in outputs), outputs)
    assert layer.weight is not None
    layer.weight.data = torch.randn(layer.out_features, k, generator=torch.Generator().manual_seed(seed))
    return layer


def _reference(layers: list[Linear], x: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    for layer in layers:
        assert layer.weight is not None
        y = x @ layer.weight.T
        for name, (begin, end) in layer.row_ranges().items():
            out[name] = y[:, begin:end]
    return out


def test_a_fused_parent_gives_views_of_one_output_with_adjacent_names_as_one_view() -> None:
    fused = _layer([("query", 4), ("key", 4), ("value", 6), ("z", 6), ("b", 2), ("a", 2)])
    plan = InputProjections(("in_proj",), [fused], [("query", "key", "value"), ("z",), ("b",), ("a",)])
    x = torch.randn(3, 8)
    qkv, z, b, a = plan.run(x)
    ref = _reference([fused], x)
    torch.testing.assert_close(qkv, torch.cat([ref["query"], ref["key"], ref["value"]], dim=-1))
    for got, name in ((z, "z"), (b, "b"), (a, "a")):
        torch.testing.assert_close(got, ref[name])
    # one GEMM output: every group is a view of it at its column offset (row stride = the fused width)
    assert qkv.stride() == z.stride() == (fused.out_features, 1)
    assert z.data_ptr() == qkv.data_ptr() + 14 * qkv.element_size()
    assert a.data_ptr() == qkv.data_ptr() + 22 * qkv.element_size()


def test_a_group_across_two_parents_is_concatenated_and_groups_may_skip_columns() -> None:
    query_key = _layer([("query", 4), ("key", 4)], seed=1)
    value_z = _layer([("value", 6), ("z", 6)], seed=2)
    plan = InputProjections(("qk", "vz"), [query_key, value_z], [("query", "key", "value"), ("z",)])
    x = torch.randn(2, 8)
    qkv, z = plan.run(x)
    ref = _reference([query_key, value_z], x)
    torch.testing.assert_close(qkv, torch.cat([ref["query"], ref["key"], ref["value"]], dim=-1))
    torch.testing.assert_close(z, ref["z"])
    only_key = InputProjections(("qk",), [query_key], [("key",)])  # the query columns are read by nobody
    torch.testing.assert_close(only_key.run(x)[0], ref["key"])


def test_bind_refuses_unknown_names_and_overlapping_groups() -> None:
    fused = _layer([("gate", 4), ("up", 4)])
    with pytest.raises(ValueError, match=r"no output named \['down'\]"):
        InputProjections(("gate_up",), [fused], [("gate",), ("down",)])
    with pytest.raises(ValueError, match="overlap"):
        InputProjections(("gate_up",), [fused], [("gate", "up"), ("up",)])


class _Module(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = _layer([("gate", 4)], seed=3)
        self.up_proj = _layer([("up", 4)], seed=4)
        self.input_projections: tuple[str, ...] = ("gate_proj", "up_proj")


def test_the_bound_plan_follows_input_projections() -> None:
    module = _Module()
    x = torch.randn(2, 8)
    first = bound_inputs(module, [("gate",), ("up",)])
    assert bound_inputs(module, [("gate",), ("up",)]) is first  # bound once, reused
    gate, up = first.run(x)
    fused = _layer([("gate", 4), ("up", 4)])
    assert (
        fused.weight is not None and module.gate_proj.weight is not None and module.up_proj.weight is not None
    )
    fused.weight.data = torch.cat([module.gate_proj.weight, module.up_proj.weight])
    module.gate_up_proj = fused
    module.input_projections = ("gate_up_proj",)  # swapping the parents: assign the names anew
    second = bound_inputs(module, [("gate",), ("up",)])
    assert second is not first and second.layers == (fused,)
    gate2, up2 = second.run(x)
    torch.testing.assert_close(gate2, gate)
    torch.testing.assert_close(up2, up)
