"""Seed 003 sandbox.json: reader, expansion, and the policy compiled from it (decide floor)."""
