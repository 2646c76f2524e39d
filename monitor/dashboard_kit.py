"""The building blocks of the generated Grafana dashboards: queries (`Q`), panels (`P`), boards (`Board`)
and the PromQL helpers every board uses (`sel`, `rate`, `quantile(s)`, `ratio`), so all queries filter by
`instance=~"$instance"` and rate over `$__rate_interval` the same way."""

from __future__ import annotations

from dataclasses import dataclass, field

SEL = '{instance=~"$instance"}'
RI = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Q:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class P:
    title: str
    queries: tuple[Q, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | table
    description: str = ""


@dataclass(frozen=True)
class Board:
    file: str
    uid: str
    title: str
    description: str
    panels: tuple[P, ...]
    tags: tuple[str, ...] = field(default=("ninfer",))


def sel(extra: str = "") -> str:
    return '{instance=~"$instance"' + (", " + extra if extra else "") + "}"


def rate(metric: str, extra: str = "") -> str:
    return f"rate({metric}{sel(extra)}[{RI}])"


def quantile(metric: str, q: float, by: str = "le") -> str:
    return f"histogram_quantile({q}, sum by ({by}) ({rate(metric + '_bucket')}))"


def quantiles(metric: str) -> tuple[Q, ...]:
    return tuple(Q(quantile(metric, q), f"p{int(q * 100)}") for q in (0.5, 0.95, 0.99))


def ratio(num: str, den: str) -> str:
    return f"sum({num}) / sum({den})"
