"""First-party `proc` executor plugin: bubblewrap, or Landlock + seccomp, with resource limits."""
