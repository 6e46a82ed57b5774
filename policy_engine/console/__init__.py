"""The console: evidence, approvals and policy changes in a browser (``serve --console``)."""
