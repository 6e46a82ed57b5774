"""The Public Suffix List for SBP302: the suffixes a `*.suffix` host wildcard must not be.

The whole list (https://publicsuffix.org: ICANN suffixes such as `com` and `co.uk`, and the
private ones where anyone can obtain a subdomain, such as `github.io`, `r2.dev` or
`pythonanywhere.com`), from the maintained `publicsuffixlist` package, which ships the list
file in its wheel: nothing is fetched at run time, so the lint works offline. Upgrading that
package updates the list. A `*.suffix` whose suffix is a single label is always public (every
top-level domain is).
"""

from __future__ import annotations

from functools import lru_cache

from publicsuffixlist import PublicSuffixList


@lru_cache(maxsize=2)
def _suffixes(only_icann: bool) -> PublicSuffixList:
    # read once per process (~50 ms each): only a lint that meets a wildcard pays for it
    return PublicSuffixList(only_icann=only_icann)


def public_suffix(suffix: str) -> str | None:
    """Why ``suffix`` (canonical, no leading ``*.``) is public, or ``None`` if it is not."""
    if "." not in suffix:
        return "a top-level domain"
    if not _suffixes(False).is_public(suffix):
        return None
    if _suffixes(True).is_public(suffix):
        return "a public suffix"
    return "a hosting suffix where anyone can get a subdomain"
