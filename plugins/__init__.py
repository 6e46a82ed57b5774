"""First-party plugins: packaged and registered exactly as a third-party plugin would be.

Each sub-package is named by an entry point in the ``policy_engine.plugins`` group and imports
only the public API (``policy_engine.*`` protocols, model, errors) and the hook markers.
"""
