"""`ninfer-artifact build-tiny --script`: the script file, the context check, and the built model's output
through the real engine after different conversations (the model must not depend on the prompt)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.artifact.cli import main
from engine.artifact.container import read_directory
from engine.llm import LLM
from engine.request import SamplingParams
from engine.testing.script import Script, ScriptError, build_scripted

SCRIPT = {
    "reasoning": "The user wants the weather; I will call the tool.",
    "content": "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>",
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built through the CLI, which also decodes it through the engine before it reports success."""
    root = tmp_path_factory.mktemp("scripted")
    (root / "script.json").write_text(json.dumps(SCRIPT))
    assert main(["build-tiny", str(root / "m.ninfer"), "--script", str(root / "script.json")]) == 0
    return root / "m.ninfer"


def test_script_file_format(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"content": "Hi."}))
    script = Script.from_file(path)
    assert script == Script("", "Hi.")
    assert script.continuation(thinking=True) == "\n</think>\n\nHi."
    assert Script("R.", "C.").continuation(thinking=False) == "C."
    for bad in ("not json", json.dumps({"reasoning": "x"}), json.dumps({"content": "x", "extra": 1}),
                json.dumps({"content": "x", "reasoning": 3}), json.dumps(["content"])):  # fmt: skip
        path.write_text(bad)
        with pytest.raises(ScriptError, match=str(path)):
            Script.from_file(path)


def test_script_needing_more_context_is_refused(tmp_path: Path) -> None:
    params = "".join(f"<parameter={n}>\nx\n</parameter>\n" for n in ("a", "b", "c"))
    script = Script("", f"<tool_call>\n<function=f>\n{params}</function>\n</tool_call>")
    with pytest.raises(ScriptError, match="more than 7 tokens of context: .* followed by both"):
        build_scripted(tmp_path / "m.ninfer", script)
    assert not (tmp_path / "m.ninfer").exists()


def test_cli_reports_bad_scripts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text("{}")
    assert main(["build-tiny", str(tmp_path / "m.ninfer"), "--script", str(tmp_path / "bad.json")]) == 1
    assert 'string "content"' in capsys.readouterr().err
    assert main(["build-tiny", str(tmp_path / "m.ninfer"), "--script", str(tmp_path / "none.json")]) == 1
    assert main(["build-tiny", str(tmp_path / "m.ninfer"), "--script", "x", "--arch", "moe"]) == 2
    assert not (tmp_path / "m.ninfer").exists()


def test_scripted_model_is_a_development_identity(scripted: Path) -> None:
    directory = read_directory(scripted)
    assert (directory.model_id, directory.weights_id) == ("ninfer-tiny-dense", "scripted")
    assert scripted.stat().st_size < 100 << 20


def _conversations() -> list[tuple[list[dict[str, Any]], bool]]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
    }
    return [
        ([{"role": "user", "content": "Paris weather? <tool_call> the </think> 3"}], True),
        ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x" * 40}], False),
        ([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
          {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], True),
    ]  # fmt: skip


def test_output_is_the_script_whatever_the_conversation(scripted: Path) -> None:
    llm = LLM(scripted, max_context=1024, max_concurrency=3)
    tokenizer = llm.get_tokenizer()
    prompts, wanted = [], []
    for messages, thinking in _conversations():
        prompts.append(tokenizer.apply_chat_template(messages, tools=TOOLS, enable_thinking=thinking))
        wanted.append(Script(**SCRIPT).continuation(thinking=thinking))
    # batched, and with the model's own sampling defaults: the scripted margin overrules the sampler
    outputs = llm.generate(
        prompts, SamplingParams(temperature=1.0, top_k=20, presence_penalty=1.5, max_tokens=80)
    )
    assert [o.text for o in outputs] == wanted
    assert {o.finish_reason for o in outputs} == {"stop"}
