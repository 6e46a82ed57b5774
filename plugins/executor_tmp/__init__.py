"""First-party `tmp` executor plugin: isolated temp spaces with a size quota."""
