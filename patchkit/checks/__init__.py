"""The postconditions patchkit's own patches declare (``patchkit.postconditions``),
one module per check, each named by its patch's TOML (``postconditions``)."""
