"""`build-tiny --script`: a tiny model whose constructed weights make greedy decoding emit a given continuation.

Random tiny weights never emit a tool call, so the protocol paths that need one (reasoning, tool calls,
malformed calls) could only be tested against a stand-in engine. A scripted model sends those scenarios
through the real engine, parsers and SDKs instead.

The script (a JSON file, see ``Script.from_file``) holds a ``reasoning`` and a ``content`` text. After a
prompt that ends inside a think block (``<|im_start|>assistant\\n<think>\\n``) the model emits
``reasoning + "\\n</think>\\n\\n" + content + <|im_end|>``; after the thinking-off prompt (the empty think
block) it emits ``content + <|im_end|>``. The prompt before the generation prompt does not matter.

Construction (the tiny dense layout of ``tiny.py``, 8 layers, hidden 64; only the weights differ):

* every attention ``o_proj``, every MLP ``down_proj`` and the ``out_proj`` of GDN layers 2.. are zero, so
  those layers add nothing to the residual stream;
* GDN layers 0 and 1 are *carriers*: ``A_log = log(100)`` with ``a = 0`` gives ``g ~ -69`` (the state
  resets every token), ``b = 0`` gives ``beta = 1/2``, the q and k channels are the same rows of
  ``in_proj_qkv`` with the same (lag 0) conv tap, so ``q^ . k^ = 1`` and the core output is ``v_t / 8``;
  the conv of each value head picks one earlier token (lags 1, 2, 3, 1), and ``z`` reads a constant
  embedding channel so the output gate is positive. Layer 0 thus adds features of tokens ``t-1..t-3``;
  layer 1, reading the residual that already carries those, adds ``t-4..t-6``. The final hidden state is
  a fixed function of the last ``CONTEXT_TOKENS = 7`` tokens and of nothing else;
* embeddings: one random row per token of the script and of the generation prompts, one shared row for
  every other token; a constant channel 0 feeds ``z``;
* ``lm_head``: the final hidden states are computed by running this package's own model over the
  generation prompts followed by the continuations (teacher forcing), and only the rows of tokens the
  continuation emits are fitted (least squares, then a multi-class hinge loss), scaled so the wanted
  token leads every other logit by ``MARGIN``; all other rows are zero. The margin is large enough that
  the sampling defaults (temperature, presence penalty) do not change the output either.

Seven tokens are enough for the Qwen3.5 generation prompts: ``<|im_end|>\\n<|im_start|>assistant\\n<think>\\n``
is itself seven tokens, so no window ever reaches the user's text. A script in which one window of seven
tokens is followed by two different tokens cannot be built and is refused with ``ScriptError``; the model
is also decoded greedily through the real engine (``verify_scripted``) before ``build_scripted`` returns.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.artifact.container import write_artifact
from engine.artifact.convert import frontend_resources
from engine.testing.tiny import TINY_MODEL_IDS, tiny_hf_config, tiny_weights

if TYPE_CHECKING:
    from engine.model.config import ModelConfig
    from engine.tokenizer import Tokenizer

CONTEXT_TOKENS = 7  # the window the carriers see: the current token and six before it
MARGIN = 40.0  # logit lead of the scripted token over every other token
SCRIPTED_WEIGHTS_ID = "scripted"
_THINK_CLOSE = "\n</think>\n\n"
_CARRIERS = (0, 1)  # GDN layers that carry earlier tokens (their state_index equals the layer id here)
_VALUE_LAGS = (1, 2, 3, 1)  # conv lag of each value head of a carrier layer
_CONST = 3.0  # channel 0 of every embedding row (rms of a row is 1)
_Z_GAIN = 2.0  # z = _Z_GAIN * channel 0 of the normed input: silu(z) > 0 for every token


class ScriptError(ValueError):
    """The script cannot be built into a model (bad file, or more context needed than the model sees)."""


@dataclass(frozen=True)
class Script:
    """What the scripted model says: ``reasoning`` (thinking on only) and ``content``."""

    reasoning: str
    content: str

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Script:
        """A JSON object ``{"reasoning": "...", "content": "..."}`` (``reasoning`` optional, default "")."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ScriptError(f"{path}: not JSON ({exc})") from exc
        return cls.from_json(data, source=str(path))

    @classmethod
    def from_json(cls, data: Any, *, source: str = "script") -> Script:
        if not isinstance(data, dict) or not isinstance(data.get("content"), str):
            raise ScriptError(f'{source}: expected a JSON object with a string "content"')
        unknown = sorted(set(data) - {"reasoning", "content"})
        if unknown:
            raise ScriptError(f"{source}: unknown keys {unknown}; allowed: reasoning, content")
        reasoning = data.get("reasoning", "")
        if not isinstance(reasoning, str):
            raise ScriptError(f'{source}: "reasoning" must be a string')
        return cls(reasoning, data["content"])

    def continuation(self, *, thinking: bool) -> str:
        """The text emitted after a thinking-on (inside ``<think>``) or thinking-off generation prompt."""
        return (self.reasoning + _THINK_CLOSE if thinking else "") + self.content


def _generation_prompts(tokenizer: Tokenizer) -> dict[bool, list[int]]:
    """thinking -> the token ids of a short rendered prompt (only its last CONTEXT_TOKENS matter)."""
    out = {}
    for thinking in (True, False):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi there"}], enable_thinking=thinking
        )
        out[thinking] = tokenizer.encode(text)
    return out


def _sequences(script: Script, tokenizer: Tokenizer) -> list[tuple[list[int], int]]:
    """(token ids, index of the first position whose next token is scripted) per generation prompt."""
    im_end = tokenizer.special_ids.im_end_id
    assert im_end is not None, "the Qwen3.5 tokenizer has <|im_end|>"
    seqs = []
    for thinking, prompt in _generation_prompts(tokenizer).items():
        ids = prompt + tokenizer.encode(script.continuation(thinking=thinking)) + [im_end]
        seqs.append((ids, len(prompt) - 1))
    return seqs


def _check_context(seqs: Sequence[tuple[list[int], int]], tokenizer: Tokenizer) -> None:
    """Refuse a script in which one window of CONTEXT_TOKENS tokens must be followed by two tokens."""
    seen: dict[tuple[int, ...], int] = {}
    for ids, first in seqs:
        for i in range(first, len(ids) - 1):
            window = tuple(ids[max(0, i - CONTEXT_TOKENS + 1) : i + 1])
            if seen.setdefault(window, ids[i + 1]) != ids[i + 1]:
                raise ScriptError(
                    f"the script needs more than {CONTEXT_TOKENS} tokens of context: "
                    f"{tokenizer.decode(list(window))!r} is followed by both "
                    f"{tokenizer.decode([seen[window]])!r} and {tokenizer.decode([ids[i + 1]])!r}; "
                    "reword the script so that every 7-token run is followed by one token"
                )


def _embeddings(vocab: int, hidden: int, known: Sequence[int], gen: torch.Generator) -> torch.Tensor:
    """[vocab, hidden]: a random row (rms 1, channel 0 = _CONST) per known token, one shared row otherwise."""
    rows = torch.randn(len(known) + 1, hidden - 1, generator=gen)
    rows = rows / rows.norm(dim=-1, keepdim=True) * math.sqrt(hidden - _CONST**2)
    rows = torch.cat([torch.full((rows.shape[0], 1), _CONST), rows], dim=-1)
    table = rows[-1].expand(vocab, hidden).clone()
    table[torch.tensor(list(known))] = rows[:-1]
    return table


def _carrier(config: ModelConfig, prefix: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Weights of one carrier GDN layer (see the module docstring)."""
    c, hidden = config, config.hidden_size
    key_dim, v_dim = c.linear_key_dim, c.linear_value_head_dim
    kernel = c.linear_conv_kernel_dim
    assert len(_VALUE_LAGS) == c.linear_num_value_heads and max(_VALUE_LAGS) < kernel
    qk = torch.randn(key_dim, hidden, generator=gen) / math.sqrt(hidden)
    qk[:, 0] = 0.0  # the constant channel would make every q alike; harmless but uninformative
    value = torch.randn(c.linear_value_dim, hidden, generator=gen) / math.sqrt(hidden)
    conv = torch.zeros(c.conv_dim, 1, kernel)
    conv[: 2 * key_dim, 0, kernel - 1] = 1.0  # q and k: the current token
    for head, lag in enumerate(_VALUE_LAGS):
        start = 2 * key_dim + head * v_dim
        conv[start : start + v_dim, 0, kernel - 1 - lag] = 1.0
    z = torch.zeros(c.linear_value_dim, hidden)
    z[:, 0] = _Z_GAIN
    out = torch.randn(hidden, c.linear_value_dim, generator=gen) / math.sqrt(c.linear_value_dim)
    out[0] = 0.0  # keep channel 0 constant-ish for the next carrier's z
    num_v = c.linear_num_value_heads
    return {
        f"{prefix}.in_proj_qkv.weight": torch.cat([qk, qk, value]),
        f"{prefix}.in_proj_z.weight": z,
        f"{prefix}.in_proj_a.weight": torch.zeros(num_v, hidden),
        f"{prefix}.in_proj_b.weight": torch.zeros(num_v, hidden),
        f"{prefix}.conv1d.weight": conv,
        f"{prefix}.dt_bias": torch.zeros(num_v),
        f"{prefix}.A_log": torch.full((num_v,), math.log(100.0)),
        f"{prefix}.norm.weight": torch.ones(v_dim),
        f"{prefix}.out_proj.weight": out,
    }


def _body_weights(config: ModelConfig, known: Sequence[int], seed: int) -> dict[str, torch.Tensor]:
    """Every weight except the fitted lm_head rows (fp32), keyed by model name."""
    hf = tiny_hf_config("dense")
    weights = {name: t.float() for name, t in tiny_weights(hf, seed)}
    gen = torch.Generator().manual_seed(seed + 1)
    for name in weights:
        if name.startswith("model.layers.") and name.endswith(
            ("o_proj.weight", "down_proj.weight", "out_proj.weight")
        ):
            weights[name].zero_()
    for layer in _CARRIERS:
        assert config.layer_types[layer] == "linear_attention"
        weights.update(_carrier(config, f"model.layers.{layer}.linear_attn", gen))
    weights["model.embed_tokens.weight"] = _embeddings(config.vocab_size, config.hidden_size, known, gen)
    weights["lm_head.weight"] = torch.zeros(config.vocab_size, config.hidden_size)
    return weights


def _final_hidden(config: ModelConfig, weights: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """Teacher forcing through our own model: the final (normed) hidden state of every position, fp32."""
    from engine.model.forward import allocate_model_cache, make_forward_batch
    from engine.model.loader import build_model

    model = build_model(
        config, {n: t for n, t in weights.items() if not n.startswith("mtp.")}, "cpu", torch.float32
    )
    page_size = 64
    pages = list(range(-(-len(ids) // page_size)))
    cache = allocate_model_cache(config, len(pages), page_size, 1, torch.float32)
    batch = make_forward_batch([ids], [0], [pages], [0], page_size)
    with torch.no_grad():
        return model(batch, cache).float()


def _fit_head(
    features: torch.Tensor, targets: torch.Tensor, steps: int = 400
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows for the emitted tokens: (classes [C], weight [C, hidden]) with min margin MARGIN over the
    other classes and over the zero logit of every other vocabulary row."""
    classes, labels = torch.unique(targets, return_inverse=True)
    onehot = torch.nn.functional.one_hot(labels, len(classes)).float()
    gram = features.T @ features + 1e-3 * torch.eye(features.shape[1])
    weight = torch.linalg.solve(gram, features.T @ (2 * onehot - 1)).T.contiguous().requires_grad_(True)
    optimizer = torch.optim.Adam([weight], lr=0.02)
    for _ in range(steps):
        margins = _margins(features, weight, labels)
        if margins.min() >= 1.0:
            break
        loss = torch.relu(1.0 - margins).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        margin = _margins(features, weight, labels).min().item()
        if margin <= 0:
            raise ScriptError(
                f"could not separate the script's {len(targets)} positions in hidden size {features.shape[1]} "
                f"(worst margin {margin:.3f}); shorten the script"
            )
        return classes, (weight * (MARGIN * 1.25 / margin)).detach()


def _margins(features: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per position: wanted logit minus the best other (other classes and the zero rows)."""
    logits = features @ weight.T
    wanted = logits.gather(1, labels[:, None])[:, 0]
    others = logits.scatter(1, labels[:, None], float("-inf")).amax(dim=1).clamp(min=0.0)
    return wanted - others


def scripted_weights(script: Script, *, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """The full tensor list (bf16, A_log fp32) of a model that emits `script`; raises ScriptError."""
    from engine.model.config import ModelConfig
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.qwen35()
    config = ModelConfig.from_hf(tiny_hf_config("dense"))
    seqs = _sequences(script, tokenizer)
    _check_context(seqs, tokenizer)
    known = sorted({t for ids, _ in seqs for t in ids})
    weights = _body_weights(config, known, seed)
    features, targets = [], []
    for ids, first in seqs:
        hidden = _final_hidden(config, weights, ids)
        features.append(hidden[first:-1])
        targets.append(torch.tensor(ids[first + 1 :]))
    classes, rows = _fit_head(torch.cat(features), torch.cat(targets))
    weights["lm_head.weight"][classes] = rows
    check = _margins(
        torch.cat(features), rows.bfloat16().float(), torch.searchsorted(classes, torch.cat(targets))
    )
    if check.min() < MARGIN / 2:
        raise ScriptError(f"bf16 rounding left a margin of {check.min().item():.1f} < {MARGIN / 2}")
    return [(n, t if n.endswith("A_log") else t.to(torch.bfloat16)) for n, t in weights.items()]


def verify_scripted(path: str | os.PathLike[str], script: Script) -> None:
    """Greedy-decode the artifact through the real engine after both generation prompts; raise on a miss."""
    from engine.llm import LLM
    from engine.request import SamplingParams

    llm = LLM(path, max_context=2048, max_concurrency=2)
    tokenizer = llm.get_tokenizer()
    for thinking in (True, False):
        prompt = tokenizer.apply_chat_template(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}],
            enable_thinking=thinking,
        )
        want = script.continuation(thinking=thinking)
        budget = len(tokenizer.encode(want)) + 4
        got = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=budget))[0]
        if got.text != want or got.finish_reason != "stop":
            raise ScriptError(
                f"verification failed (thinking={thinking}): the engine emitted {got.text!r} "
                f"({got.finish_reason}), expected {want!r}"
            )


def build_scripted(
    out: str | os.PathLike[str], script: Script, *, seed: int = 0, verify: bool = True
) -> Path:
    """Write a scripted tiny model (identity ninfer-tiny-dense/scripted), verified through the engine."""
    config = tiny_hf_config("dense")
    path = write_artifact(
        out,
        model_id=TINY_MODEL_IDS["dense"],
        weights_id=SCRIPTED_WEIGHTS_ID,
        tensors=scripted_weights(script, seed=seed),
        resources=frontend_resources(config, moe=False),
    )
    if verify:
        try:
            verify_scripted(path, script)
        except ScriptError:
            path.unlink()
            raise
    return path
