"""Synthetic prompt text of a given approximate token count (no tokenizer needed, deterministic per seed).

Words are common short English words (one Qwen token each, with the leading space), so `n` words is close
to `n` tokens; code-like text for repository context mixes identifiers and punctuation at about the same
rate. The reports use the server's own `usage` numbers, never these estimates.
"""

from __future__ import annotations

import random

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any like now my "
    "such make over our even most me state after also made many did must before back see through way where "
    "get much go well your know should down work year because come people just say each those take day good "
    "how long little use own man right life give world hand part small number off always move both between"
).split()
IDENTS = (
    "config request page slot lane token state cache prefix engine runner sampler batch queue index value "
    "result stream buffer offset length count limit event handler client server session model layer"
).split()
CODE_TEMPLATES = (
    "def {a}_{b}(self, {c}: int) -> {d}:",
    "    return self.{a}[{c}] + {b}_{d}",
    "    if {a} is None: raise ValueError('{b}')",
    "class {A}{B}:",
    "    {a}_{b} = {c}.{d}({a}, {b})",
    "# {a} {b} {c} {d}",
)


def prose(num_tokens: int, rng: random.Random) -> str:
    """About `num_tokens` tokens of word salad."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, num_tokens)))


def code(num_tokens: int, rng: random.Random) -> str:
    """About `num_tokens` tokens of Python-looking lines (repository context, tool output)."""
    lines: list[str] = []
    budget = max(1, num_tokens)
    while budget > 0:
        a, b, c, d = (rng.choice(IDENTS) for _ in range(4))
        line = rng.choice(CODE_TEMPLATES).format(a=a, b=b, c=c, d=d, A=a.title(), B=b.title())
        lines.append(line)
        budget -= max(1, len(line) // 4)
    return "\n".join(lines)


def salt(rng: random.Random) -> str:
    """A short unique marker for the start of a prompt, so no two prompts share a cached prefix."""
    return f"[run {rng.getrandbits(48):012x}]"
