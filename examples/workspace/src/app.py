"""A tiny module for the demo workspace."""


def greet(name: str) -> str:
    return f"hello, {name}"
