"""Rolling out policy changes safely: hot reload of a running engine."""
