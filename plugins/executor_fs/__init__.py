"""First-party `fs` executor plugin: no-follow file access beneath the profile's root."""
