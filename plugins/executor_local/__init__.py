"""The `local` executor: runs argv on the host (seed 004 ``LocalSandboxRunner``), always degraded."""
