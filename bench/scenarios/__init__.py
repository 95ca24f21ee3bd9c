"""One module per scenario, each with `run(argv) -> dict`."""
