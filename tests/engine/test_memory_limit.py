"""`--gpu-memory-limit GiB` (engine/config.py, engine/flags.py, engine/core.py): the config's rules, the flag's
parsing, and what the engine does with the cap off CUDA (nothing: the CPU has no device memory to cap)."""

from __future__ import annotations

import argparse

import pytest
import torch

from engine.config import EngineConfig
from engine.core import apply_memory_limit
from engine.flags import add_engine_flags, engine_config


@pytest.mark.parametrize("value", [32, 31.5, 0.25])
def test_a_positive_limit_is_accepted_in_gib(value):
    config = EngineConfig.from_flags(gpu_memory_limit=value)
    assert config.gpu_memory_limit == value
    assert config.gpu_memory_limit_bytes == int(value * 1024**3)


@pytest.mark.parametrize("value", [0, -1, 0.0, True, "lots", float("nan"), float("inf")])
def test_a_non_positive_or_non_numeric_limit_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match=r"gpu_memory_limit=.*: must be a positive number of GiB"):
        EngineConfig.from_flags(gpu_memory_limit=value)


def test_unset_means_the_whole_device():
    assert EngineConfig().gpu_memory_limit is None and EngineConfig().gpu_memory_limit_bytes is None


def test_the_flag_parses_gib_and_reaches_the_config():
    p = argparse.ArgumentParser()
    add_engine_flags(p)
    assert engine_config(p.parse_args(["--gpu-memory-limit", "31.5"]), None).gpu_memory_limit == 31.5
    with pytest.raises(ValueError, match="gpu_memory_limit='x'"):
        engine_config(p.parse_args(["--gpu-memory-limit", "x"]), None)


def test_the_cap_is_not_applied_off_cuda():
    config = EngineConfig.from_flags(gpu_memory_limit=1)
    assert apply_memory_limit(config, torch.device("cpu")) is None
