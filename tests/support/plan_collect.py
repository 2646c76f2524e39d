"""A pytest plugin for tests/engine/test_device_plans.py: one collection answers every plan stage's selection.

`pytest --collect-only -m gpu -p plan_collect FILES...` with NINFER_PLAN_QUERIES (JSON: a list of
{"paths": [...], "k": expression or null}) writes to NINFER_PLAN_OUT, per query and path, how many of the
collected gpu tests that path and `-k` select (pytest's own keyword matching), so N plan stages cost one
collection instead of N.
"""

from __future__ import annotations

import json
import os

import pytest
from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression


def _under(nodeid: str, path: str) -> bool:
    if "::" not in path:
        return nodeid.startswith(path.rstrip("/") + ("::" if path.endswith(".py") else "/"))
    return nodeid == path or nodeid.startswith(path + "[") or nodeid.startswith(path + "::")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    queries = json.loads(os.environ["NINFER_PLAN_QUERIES"])
    answers = []
    for query in queries:
        expr = Expression.compile(query["k"]) if query["k"] else None
        picked = [item for item in items if expr is None or expr.evaluate(KeywordMatcher.from_item(item))]
        answers.append({path: sum(_under(item.nodeid, path) for item in picked) for path in query["paths"]})
    with open(os.environ["NINFER_PLAN_OUT"], "w", encoding="utf-8") as out:
        json.dump(answers, out)
