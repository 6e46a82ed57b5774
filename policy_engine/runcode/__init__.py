"""run_code (seed 001): static risk hints, security modes and the SandboxManager entry point."""
