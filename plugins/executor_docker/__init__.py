"""First-party `docker` executor plugin: proc.exec in hardened containers (seed 002 §4)."""
