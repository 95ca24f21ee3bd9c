"""`python -m bench <scenario> [options]`: run one benchmark scenario.

A scenario is the module `bench.scenarios.<name>` with a `run(argv) -> dict` function; the
harness prints the scenario's table, then the returned figures as the final JSON line.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys

import bench.scenarios


def available() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(bench.scenarios.__path__))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m bench <scenario> [options]\nscenarios: {', '.join(available())}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in available():
        print(f"unknown scenario {name!r}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.scenarios.{name}")
    figures = module.run(rest)
    print(json.dumps({"scenario": name, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
