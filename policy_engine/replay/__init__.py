"""Replay: record what deciding a call again needs, and re-decide recorded calls offline."""
