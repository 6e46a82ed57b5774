"""Skills (seed 002 §7): checked manifests that compile to tool manifests, and their invocation."""
