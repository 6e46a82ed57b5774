"""Adapters that make each engine decide the benchmark's decision set (ours and the peers)."""
