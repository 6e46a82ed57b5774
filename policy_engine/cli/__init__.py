"""Command-line interface: one module per command; no logic beyond arguments and rendering."""
