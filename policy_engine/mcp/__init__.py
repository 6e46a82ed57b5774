"""The MCP face of the engine: skills as tools over stdio and streamable HTTP (extra `mcp`)."""
