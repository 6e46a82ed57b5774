"""The seed 003 sandbox runner: runs a command under a sandbox.json (a face)."""
