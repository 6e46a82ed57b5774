"""A dict that refuses changes: the ``limit_layers`` maps shared by profiles and decisions."""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

from pydantic import AfterValidator


class ReadOnlyDict(dict[str, str]):
    """A ``dict`` (it serialises, compares and reads as one) whose contents cannot change.

    Per-call profiles share their shape's maps and decisions share their compilation's (that is
    what makes a new grant cheap), and the models holding them are frozen: an edit through one
    call's map must not rewrite what every later call reports. Copy it (``dict(m)``) to change.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("this map is shared by other profiles and decisions and cannot change: "
                        "copy it with dict(...)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[ReadOnlyDict], tuple[dict[str, str]]]:
        return ReadOnlyDict, (dict(self),)

    def __copy__(self) -> ReadOnlyDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> ReadOnlyDict:
        return self


def _read_only(value: dict[str, str]) -> dict[str, str]:
    return value if type(value) is ReadOnlyDict else ReadOnlyDict(value)


LayerMap = Annotated[dict[str, str], AfterValidator(_read_only)]
"""``limit_layers``: per limit field, the layer that set it (read-only once validated)."""
