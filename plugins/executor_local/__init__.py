"""The `local` executor: argv on the host (seed 004 ``LocalSandboxRunner``), always degraded."""
