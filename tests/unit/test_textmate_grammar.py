"""The TextMate grammar, run by a real TextMate engine, scopes every token as Lark lexes it."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytest
from lark import Token
from lark.exceptions import UnexpectedInput
from textmate_grammar.parsers.base import LanguageParser

from policy_engine.compiler.values import DURATION_UNITS_MS, SIZE_UNITS
from policy_engine.dsl.grammar import comment_sink, get_parser
from policy_engine.model import CapabilityKind
from policy_engine.model.enums import BrowserScope, NetworkMode, SafetyClass, SideEffect

ROOT = Path(__file__).resolve().parents[2]
GRAMMAR = ROOT / "dsl" / "sbpolicy.tmLanguage.json"

# (line, column) -> the scopes at that character, 0-based like the engine.
ScopeMap = dict[tuple[int, int], list[str]]


def _corpus() -> list[Path]:
    files = sorted((ROOT / "examples" / "policies").glob("*.sbpolicy"))
    files += sorted((ROOT / "examples" / "manifests").glob("*.sbpolicy"))
    files += sorted((ROOT / "tests" / "data").glob("**/*.sbpolicy"))
    files += sorted((ROOT / "tests" / "fixtures" / "policies").glob("**/*.sbpolicy"))
    return files


def _doc_blocks() -> list[str]:
    """Every ```sbpolicy block of docs/language.md (each one compiles; test_dsl_docs checks it)."""
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    return re.findall(r"```sbpolicy\n(.*?)```", text, flags=re.S)


@lru_cache(maxsize=1)
def _engine() -> LanguageParser:
    # The engine logs every character it skips as a warning; the assertions below check that.
    logging.getLogger("textmate_grammar").setLevel(logging.CRITICAL)
    return LanguageParser(json.loads(GRAMMAR.read_text(encoding="utf-8")))


def scopes_of(text: str) -> ScopeMap:
    """Tokenize ``text`` and give each character its scope list (outermost first, no root)."""
    element = _engine().parse_string(text)
    assert element is not None, "the engine could not tokenize the text at all"
    out: ScopeMap = {}
    for (line, col), chunk, scopes in element.flatten():
        # vscode-textmate splits a name on spaces into several scopes; this engine does not
        names = [s for scope in scopes[1:] for s in scope.split()]
        for i, _ in enumerate(chunk):
            out[(line, col + i)] = names
    return out


def _has(scopes: list[str], prefix: str) -> bool:
    return any(s == prefix or s.startswith(prefix + ".") for s in scopes)


def lark_tokens(text: str) -> Iterator[Token]:
    """Every token the contextual lexer produces for ``text``, comments included, in order."""
    comments: list[Token] = []
    reset = comment_sink.set(comments)
    try:
        tokens = list(get_parser().parse_interactive(text).iter_parse())
    finally:
        comment_sink.reset(reset)
    yield from sorted(tokens + comments, key=lambda t: (t.line or 0, t.column or 0))


def _chars(token: Token) -> Iterator[tuple[int, int]]:
    """The 0-based (line, column) of each character of ``token`` (CEL may span lines)."""
    line, col = (token.line or 1) - 1, (token.column or 1) - 1
    for ch in str(token):
        if ch == "\n":
            line, col = line + 1, 0
            continue
        if ch != "\r":
            yield line, col
        col += 1


_KEYWORD_TERMINALS = {"RESOURCE", "SCALAR", "TOOL", "TOOL_BLOCK"}
_PUNCTUATION = {"LBRACE", "RBRACE", "LSQB", "RSQB", "COMMA", "VBAR", "ELLIPSIS"}


def _expected(token: Token, in_limits: bool) -> str:
    """The scope prefix the TextMate grammar must give every character of a Lark token."""
    kind = token.type
    fixed = {
        "STRING": "string.quoted.double", "QUANTITY": "constant.numeric",
        "CEL": "meta.embedded.expression.cel", "COMMENT": "comment.line",
        "REGEX": "string.regexp", "KIND": "support.type.capability",
        "PERMIT": "keyword.control.effect", "FORBID": "keyword.control.effect",
        "MANDATORY": "storage.modifier.mandatory",
    }
    if kind in fixed:
        return fixed[kind]
    if kind == "WORD":
        return "variable.other.property.limit" if in_limits else "constant"
    if kind in _PUNCTUATION:
        return "punctuation" if kind in {"LBRACE", "RBRACE", "LSQB", "RSQB", "COMMA"} \
            else "keyword.operator"
    return "keyword"  # TOOL, RESOURCE, ... and every anonymous keyword (`policy`, `when`, ...)


def _cross_check(text: str, name: str) -> int:
    """Each Lark token gets the matching scope at the same place; returns how many were checked."""
    scopes = scopes_of(text)
    in_limits = False
    previous = ""
    checked = 0
    for token in lark_tokens(text):
        if token.type == "LBRACE" and previous == "LIMITS":
            in_limits = True
        elif token.type == "RBRACE":
            in_limits = False
        if token.type != "COMMENT":
            previous = token.type
        want = _expected(token, in_limits)
        for pos in _chars(token):
            got = scopes.get(pos, [])
            where = f"{name}:{pos[0] + 1}:{pos[1] + 1} {token.type} {str(token)!r}"
            assert _has(got, want), f"{where}: want {want}, got {got}"
            assert not _has(got, "invalid"), f"{where}: valid text scoped invalid: {got}"
            if token.type != "COMMENT":
                assert not _has(got, "comment"), f"{where}: scoped as a comment: {got}"
        checked += 1
    return checked


def _unscoped(text: str) -> list[str]:
    """Non-blank characters the grammar leaves with the root scope only."""
    scopes = scopes_of(text)
    out = []
    for n, line in enumerate(text.split("\n")):
        for c, ch in enumerate(line):
            if not ch.isspace() and not scopes.get((n, c)):
                out.append(f"{n + 1}:{c + 1} {ch!r}")
    return out


CORPUS = _corpus()


def test_the_corpus_is_there() -> None:
    names = {p.name for p in CORPUS}
    assert {"org.sbpolicy", "secrets.sbpolicy", "network.sbpolicy", "file-editor.sbpolicy"} <= names
    assert len(_doc_blocks()) >= 8


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_policy_agrees_with_lark(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert _unscoped(text) == []
    try:
        get_parser().parse(text)
    except UnexpectedInput:
        # a deliberately broken test input: still fully scoped (above), no token stream to compare
        return
    assert _cross_check(text, str(path.relative_to(ROOT))) >= 4  # a header alone is 4 tokens


@pytest.mark.parametrize("index", range(len(_doc_blocks())))
def test_every_docs_block_agrees_with_lark(index: int) -> None:
    text = _doc_blocks()[index]
    assert _unscoped(text) == []
    assert _cross_check(text, f"docs/language.md block {index + 1}") > 3


def test_hash_in_a_string_is_not_a_comment() -> None:
    text = 'permit "a#b" fs.read paths ["/x#y", "//z"]  # real\n'
    s = scopes_of(text)
    for ch_index in (text.index("#b"), text.index("#y"), text.index("//z")):
        assert _has(s[(0, ch_index)], "string.quoted.double")
        assert not _has(s[(0, ch_index)], "comment")
    real = text.index("# real")
    assert all(_has(s[(0, c)], "comment.line.number-sign") for c in range(real, len(text) - 1))


def test_slash_comments_and_regexes_in_args() -> None:
    text = 'permit proc.exec tool "g" args [ // first\n  /a#b\\/c/ | "x" ...] // tail\n'
    s = scopes_of(text)
    assert _has(s[(0, text.index("//"))], "comment.line.double-slash")
    line2 = text.split("\n")[1]
    for c in range(line2.index("/a"), line2.index("/ |") + 1):
        assert _has(s[(1, c)], "string.regexp"), (c, s[(1, c)])
        assert not _has(s[(1, c)], "comment")
    assert _has(s[(1, line2.index("\\/"))], "constant.character.escape")
    assert _has(s[(1, line2.index("..."))], "keyword.operator.repeat")
    assert _has(s[(1, line2.index("// tail"))], "comment.line.double-slash")
    assert _cross_check(text, "args") > 8


def test_suppression_comment_has_its_own_scope() -> None:
    text = '# sbpolicy: ignore SBP301, SBP302 reason="kept # for now"\npermit tmp.use\n# plain\n'
    s = scopes_of(text)
    assert all(_has(s[(0, c)], "comment.line.suppression") for c in range(len(text.split("\n")[0])))
    assert _has(s[(0, text.index("SBP301"))], "constant.other.diagnostic-id")
    assert _has(s[(0, text.index("SBP302"))], "constant.other.diagnostic-id")
    assert _has(s[(0, text.index("ignore"))], "keyword.other.suppression")
    assert _has(s[(0, text.index("kept"))], "string.quoted.double")
    assert not _has(s[(2, 0)], "comment.line.suppression")
    assert _has(s[(2, 0)], "comment.line.number-sign")
    assert _has(s[(1, 0)], "keyword.control.effect")  # the suppression ends with its line


def test_cel_is_embedded_across_lines() -> None:
    text = ('require consent when `profile.safety == "High" ||\n'
            '   "Write" in profile.side_effects && size(request.args) > 0u`\npermit tmp.use\n')
    s = scopes_of(text)
    first, second = text.split("\n")[:2]
    for c in range(first.index("`"), len(first)):
        if not first[c].isspace():
            assert _has(s[(0, c)], "meta.embedded.expression.cel")
    for c in range(len(second)):
        if not second[c].isspace():
            assert _has(s[(1, c)], "meta.embedded.expression.cel")
    assert _has(s[(0, first.index("profile"))], "variable.language.cel")
    assert _has(s[(0, first.index('"High"'))], "string.quoted.double.cel")
    assert _has(s[(0, first.index("=="))], "keyword.operator.comparison.cel")
    assert _has(s[(1, second.index("request"))], "variable.language.cel")
    assert _has(s[(1, second.index("size"))], "support.function.cel")
    assert _has(s[(1, second.index("0u"))], "constant.numeric.cel")
    assert _has(s[(1, second.index(" in ") + 1)], "keyword.operator.word.cel")
    assert not _has(s[(2, 0)], "meta.embedded")  # the closing backtick ends the embedding
    assert _cross_check(text, "cel") == 6


def test_timeout_is_a_keyword_in_defaults_and_a_limit_name_in_limits() -> None:
    text = "defaults {\n  timeout 5s\n  limits { timeout 3s  screenshot 1920x1080 }\n}\n"
    s = scopes_of(text)
    assert _has(s[(1, 2)], "keyword.other.setting")
    assert _has(s[(2, 11)], "variable.other.property.limit")
    assert _has(s[(2, text.split("\n")[2].index("x1080"))], "keyword.operator.dimension")
    assert _cross_check(text, "limits") == 12


def test_strings_escapes_and_unterminated_strings() -> None:
    text = 'permit fs.read paths ["a\\"b\\u00e9\\q"]\npermit fs.read paths ["open\npermit tmp.use\n'
    s = scopes_of(text)
    first = text.split("\n")[0]
    assert _has(s[(0, first.index('\\"'))], "constant.character.escape")
    assert _has(s[(0, first.index("\\u00e9"))], "constant.character.escape")
    assert _has(s[(0, first.index("\\q"))], "invalid.illegal.escape")
    # an unclosed string stops at the end of its line, as the lexer does
    assert _has(s[(2, 0)], "keyword.control.effect")
    assert not _has(s[(2, 0)], "string")


def test_invalid_text_is_marked() -> None:
    text = 'permit fs.raed paths ["/a"] @\ndefaults { limits { memory 3XB } }\n'
    s = scopes_of(text)
    assert _has(s[(0, text.index("fs.raed"))], "invalid.illegal.capability")
    assert _has(s[(0, text.index("@"))], "invalid.illegal.character")
    assert _has(s[(1, text.split("\n")[1].index("XB"))], "invalid.illegal.unit")


def test_names_of_rules_profiles_and_tools() -> None:
    text = ('forbid mandatory "no-keys" fs.read paths ["/k"]\nprofile "p" { fs read-only }\n'
            'tool "t" version "1" {\n  profile "p"\n  side_effects [Read]\n  safety Low\n}\n')
    s = scopes_of(text)
    assert _has(s[(0, text.index("no-keys"))], "entity.name.function.rule")
    assert _has(s[(1, 9)], "entity.name.type.profile")
    assert _has(s[(2, 6)], "entity.name.type.tool")
    assert not _has(s[(3, 11)], "entity.name")  # a reference in a tool block is not a definition
    assert _cross_check(text, "names") > 25


def _terminal_literals() -> list[str]:
    """Every keyword the Lark grammar spells out (`policy`, `when`, ...) plus regex keywords."""
    words = [t.pattern.value for t in get_parser().terminals
             if t.pattern.type == "str" and t.pattern.value.isidentifier()]
    resource = get_parser().get_terminal("RESOURCE").pattern.value
    scalar = get_parser().get_terminal("SCALAR").pattern.value
    for pattern in (resource, scalar):
        words += re.findall(r"[a-z_]+", pattern.split(")")[0])
    return sorted(set(words) | {"permit", "forbid", "mandatory", "tool"})


@pytest.mark.parametrize("word", _terminal_literals())
def test_every_lark_keyword_is_a_keyword(word: str) -> None:
    s = scopes_of(f"{word} x\n")
    assert all(_has(s[(0, c)], "keyword") or _has(s[(0, c)], "storage.modifier")
               for c in range(len(word))), s[(0, 0)]


def test_every_capability_kind_unit_and_enum_word() -> None:
    for kind in CapabilityKind:
        assert _has(scopes_of(f"permit {kind}\n")[(0, 7)], "support.type.capability"), kind
    for unit in [*SIZE_UNITS, *DURATION_UNITS_MS]:
        s = scopes_of(f"defaults {{ timeout 5{unit} }}\n")
        assert _has(s[(0, 20)], "keyword.other.unit"), unit
    for enum in (NetworkMode, SafetyClass, SideEffect, BrowserScope):
        for member in enum:
            s = scopes_of(f"safety {member}\n")
            assert _has(s[(0, 7)], "constant.language"), member
