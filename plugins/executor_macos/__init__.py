"""`macos-sandbox-exec`: proc.exec under a generated sandbox-exec (SBPL) profile (macOS only)."""
