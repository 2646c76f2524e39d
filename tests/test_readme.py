"""README.md against the code: the flags its command lines give each NInfer program exist in that program's parser,
every `ninfer-serve` flag is documented, and every environment variable NInfer reads is named in the README and in
engine/env.py (the list of every variable)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from api.serve import build_parser as serve_parser
from engine.artifact.cli import build_parser as artifact_parser
from engine.cli import build_parser as ninfer_parser
from engine.testing.bench.cli import build_parser as bench_parser
from monitor.cli import build_parser as monitor_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = README + (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
# a program's name where a command line starts (not inside a path or another name), then the rest of that command
COMMAND = re.compile(
    r"(?<![\w./-])(ninfer-serve|ninfer-bench|ninfer-monitor|ninfer-artifact [a-z-]+|ninfer)(?![\w.-])([^`\n#]*)"
)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _parsers() -> dict[str, set[str]]:
    parsers = {
        "ninfer-serve": _options(serve_parser()),
        "ninfer": _options(ninfer_parser()),
        "ninfer-bench": _options(bench_parser()),
        "ninfer-monitor": _options(monitor_parser({})),
    }
    subparsers = next(a for a in artifact_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        parsers[f"ninfer-artifact {name}"] = _options(sub)
    return parsers


def test_every_flag_a_documented_command_line_gives_exists() -> None:
    parsers, unknown, seen = _parsers(), [], 0
    for match in COMMAND.finditer(DOCS):
        program, rest = match.groups()
        if program not in parsers:
            continue  # `ninfer-artifact` followed by a word that is not a subcommand: prose
        # quoted values (`--server-args "..."`) are another program's flags
        rest = re.sub(r"\"[^\"]*\"|'[^']*'", "", rest)
        for flag in FLAG.findall(rest):
            seen += 1
            if flag not in parsers[program]:
                unknown.append(f"{program} {flag}: {match.group(0).strip()!r}")
    assert seen > 50, "the README's command lines were not found"
    assert not unknown, "flags a program's parser does not know:\n" + "\n".join(unknown)


def test_every_serve_flag_is_documented() -> None:
    documented = set(FLAG.findall(README))
    missing = sorted(_options(serve_parser()) - documented - {"-h", "--help"})
    assert not missing, f"ninfer-serve flags README.md never mentions: {missing}"


def test_every_environment_variable_is_named_in_the_readme_and_env_py() -> None:
    def names(text: str) -> set[str]:
        return set(re.findall(r"\bNINFER_[A-Z0-9_]*[A-Z0-9]\b", text))

    read: set[str] = set()
    for package in ("engine", "kernels", "api", "monitor"):
        for path in (ROOT / package).rglob("*.py"):
            read |= names(path.read_text(encoding="utf-8"))
    assert {"NINFER_KERNELS", "NINFER_CACHE_DIR", "NINFER_API_KEY"} <= read
    env_py = (ROOT / "engine" / "env.py").read_text(encoding="utf-8")
    assert sorted(read - names(env_py)) == [], "variables NInfer reads that engine/env.py does not list"
    assert sorted(read - names(DOCS)) == [], "variables NInfer reads that the READMEs never name"
