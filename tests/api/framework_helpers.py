"""A scripted server per framework test module (tests/api/test_frameworks*.py), with the scenarios it adds.

The scripted engine picks its continuation by a `[[name]]` marker in the last user message, and answers a
turn of tool results with `after_tool` ("It will be sunny in Paris."), so an agent loop ends after one tool
round trip. Scenarios added here are what the agent libraries' default paths expect from a model: a JSON
object for JSON outputs and calls of the output tools that the libraries name themselves.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from api_helpers import HERE, Server, free_port, start_server

MODEL = "ninfer-tiny-dense"
WEATHER_JSON = '{"city": "Paris", "temperature": 21}'


def call(name: str, **params: object) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


SCRIPTS: dict[str, tuple[str, str]] = {
    "weather_json": ("The user wants JSON.", WEATHER_JSON),
    "final_result": ("Answering with the output tool.", call("final_result", city="Paris", temperature=21)),
    "weather_tool": ("Answering with the Weather tool.", call("Weather", city="Paris", temperature=21)),
}


def start_scripted(root: Path) -> Server:
    """The scripted server with `SCRIPTS` added; the caller stops it (`api_helpers.stop_server`)."""
    scripts = root / "scripts.json"
    scripts.write_text(json.dumps(SCRIPTS), encoding="utf-8")
    port = free_port()
    cmd = [
        sys.executable, str(HERE / "scripted_server.py"), "--port", str(port), "--max-context", "4096",
        "--scripts", str(scripts), "--log-stats-interval-ms", "0",
    ]  # fmt: skip
    url, process = start_server(cmd, root / "server.log", port)
    return Server(url, process, root / "server.log")


# litellm fetches a model price list from the internet at import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
