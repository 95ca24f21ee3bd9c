"""Admin command groups of the `jobs` CLI, one module each, each exposing `cli`."""
