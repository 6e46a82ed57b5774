"""First-party `browser` executor plugin: read-only headless Chromium driven by Playwright."""
