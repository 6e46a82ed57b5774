"""Text an op can carry: a JSON document's strings that UTF-8 cannot encode (lone surrogates)."""

from __future__ import annotations

from typing import Any


def first_not_unicode(value: Any) -> str | None:
    """The JSON pointer of the first string (value or key) in ``value`` that UTF-8 cannot
    encode, else ``None``; iterative, so any depth the schema check let through is fine."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return where
        elif isinstance(item, dict):
            for key, sub in item.items():
                esc = str(key).replace("~", "~0").replace("/", "~1")
                if first_not_unicode(str(key)) is not None:
                    return f"{where}/{esc}".encode("utf-8", "backslashreplace").decode()
                stack.append((f"{where}/{esc}", sub))
        elif isinstance(item, list):
            stack.extend((f"{where}/{i}", sub) for i, sub in enumerate(item))
    return None
