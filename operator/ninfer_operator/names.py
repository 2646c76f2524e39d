"""Names of the children, always valid whatever name the resource has.

A Service (and so every child named like it) must be a DNS-1035 label: lowercase letters, digits and '-',
starting with a letter, at most 63 characters. Resource names may be DNS subdomains (`qwen3.6-27b`), so
`base_name` maps a name onto a label: other characters become '-', a leading digit gets an 'n-' prefix, and
the result is cut to BASE_MAX characters; whenever it differs from the name, a 5-hex digest of the full name
is appended so two resources never share children. Labels use the same base (label values are <= 63 too).
"""

from __future__ import annotations

import hashlib
import re

LABEL_MAX = 63
BASE_MAX = 50  # leaves room for the longest suffix ("-model") and the digest
_INVALID = re.compile(r"[^a-z0-9-]+")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# what the CRD accepts as metadata.name: a DNS-1123 subdomain of at most LABEL_MAX characters
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:5]


def base_name(name: str) -> str:
    base = _INVALID.sub("-", name.lower()).strip("-")
    if not base or not base[0].isalpha():
        base = "n-" + base
    if base == name and len(base) <= BASE_MAX:
        return base
    cut = base[: BASE_MAX - 6].rstrip("-")
    return f"{cut}-{_digest(name)}"


def child_name(name: str, suffix: str = "") -> str:
    out = base_name(name) + (f"-{suffix}" if suffix else "")
    assert DNS_1035.match(out) and len(out) <= LABEL_MAX, out
    return out


def name_errors(name: str) -> list[str]:
    """The rules the CRD schema states for metadata.name, checked again where the schema cannot reach."""
    if len(name) > LABEL_MAX:
        return [f"metadata.name {name!r} is {len(name)} characters; at most {LABEL_MAX} are allowed"]
    if not re.match(NAME_PATTERN, name):
        return [f"metadata.name {name!r} is not a DNS-1123 subdomain"]
    return []
