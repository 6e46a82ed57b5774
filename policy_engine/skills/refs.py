"""How a skill interface's local ``$ref``s evaluate: each must land on a schema in the same
interface, and a value must never be evaluated without end or exponentially often in place."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

MAX_IN_PLACE = 1000
"""Evaluations of one value a subschema may cause through ``$ref`` and the in-place
applicators (``allOf`` and the like); ``"$ref": "#"`` is endless, and thirty ``allOf`` levels
of two references each are 2^30 (attack round 32, L4: either one answered 500 on every
invoke)."""
_LISTS = ("allOf", "anyOf", "oneOf")
_ONES = ("not", "if", "then", "else")
_REFS = ("$ref", "$dynamicRef")


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _target(root: Any, ref: str) -> str | None:
    """The pointer (``""`` is the interface itself) ``ref`` lands on, if it is a schema."""
    if ref == "#":
        return ""
    if not ref.startswith("#/"):
        return None
    node, where = root, ""
    for raw in ref[2:].split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        where += f"/{_escape(part)}"
    return where if isinstance(node, dict | bool) else None


def _nodes(node: Any, where: str, out: dict[str, Any]) -> None:
    """Every object in the document by pointer, in document order."""
    if isinstance(node, dict):
        out[where] = node
        for key, value in node.items():
            _nodes(value, f"{where}/{_escape(str(key))}", out)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _nodes(item, f"{where}/{i}", out)


def _in_place(root: Any, node: dict[str, Any], where: str,
              found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(pointer of the edge, target pointer) for what evaluates ``node``'s value again."""
    edges: list[tuple[str, str]] = []
    for key in _LISTS:
        if isinstance(node.get(key), list):
            edges += [(f"{where}/{key}/{i}", f"{where}/{key}/{i}")
                      for i in range(len(node[key]))]
    for key in _ONES:
        if key in node:
            edges.append((f"{where}/{key}", f"{where}/{key}"))
    if isinstance(node.get("dependentSchemas"), dict):
        edges += [(f"{where}/dependentSchemas/{_escape(k)}",) * 2
                  for k in node["dependentSchemas"]]
    for key in _REFS:
        ref = node.get(key)
        if not isinstance(ref, str) or not ref.startswith("#"):
            continue  # a non-local one is refused by schema_problems
        at = f"{where}/{_escape(key)}"
        target = _target(root, ref)
        if target is None:
            found.append((at, f"`{key}` `{ref}` points at no schema of this interface (write "
                              "`#` or a JSON pointer `#/...` to one)"))
        else:
            edges.append((at, target))
    return edges


def ref_problems(schema: Any, at: str) -> list[tuple[str, str]]:
    """(pointer, message) for every ``$ref`` that lands nowhere, a loop of in-place
    references (reported at the ``$ref`` closing it) and a subschema over
    :data:`MAX_IN_PLACE` evaluations of one value."""
    nodes: dict[str, Any] = {}
    _nodes(schema, "", nodes)
    found: list[tuple[str, str]] = []
    for where, node in nodes.items():
        if where and "$id" in node:
            found.append((f"{at}{where}/$id", "`$id` below the interface's top changes what "
                          "`#` means: not supported in skill interfaces"))
    dangling: list[tuple[str, str]] = []
    edges = {w: _in_place(schema, n, w, dangling) for w, n in nodes.items()}
    found += [(f"{at}{w}", message) for w, message in dangling]
    if found:
        return found
    cost: dict[str, int] = {}
    for start in nodes:
        if start in cost:
            continue
        # iterative depth-first walk: a deep chain of references must not exhaust the stack
        stack: list[tuple[str, int]] = [(start, 0)]
        open_: set[str] = {start}
        while stack:
            node, i = stack[-1]
            out = edges.get(node, [])
            if i < len(out):
                stack[-1] = (node, i + 1)
                edge, target = out[i]
                if target in open_:
                    found.append((f"{at}{edge}", "a loop of in-place references (`$ref`, "
                                  "`allOf`, ...) that never reaches a part of the value: its "
                                  "evaluation would never end"))
                    return found
                if target not in cost and target in nodes:
                    stack.append((target, 0))
                    open_.add(target)
                continue
            stack.pop()
            open_.discard(node)
            total = 1 + sum(cost.get(t, 1) for _, t in out)
            cost[node] = total
            if total > MAX_IN_PLACE:
                found.append((f"{at}{node}", f"evaluates one value more than {MAX_IN_PLACE} "
                              "times through `$ref` and `allOf`/`anyOf`/...: flatten it"))
                return found
    return found
