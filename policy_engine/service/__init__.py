"""The HTTP face (`policy-engine serve`): parse, authenticate, call the library, render."""
