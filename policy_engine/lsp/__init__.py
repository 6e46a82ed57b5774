"""The `.sbpolicy` language server (`policy-engine lsp`); pygls is imported only by server.py."""
