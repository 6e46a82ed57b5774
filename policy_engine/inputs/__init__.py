"""Untrusted input readers: bounded JSON/YAML parsing and size-capped file reads."""
