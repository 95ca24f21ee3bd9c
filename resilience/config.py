"""One way for a guard decorator to take its configuration.

Every guard decorator reads ``guard(config=None, /, *, backend=None, **overrides)``: a
`*Config` instance, keyword overrides of its fields, or both. Defaults and their meaning
live only in the `*Config` docstring.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeVar

from resilience.errors import ConfigurationError

ConfigT = TypeVar("ConfigT")


def configured(
    config_class: type[ConfigT], config: ConfigT | None, overrides: dict[str, Any], *, where: str
) -> ConfigT:
    """The `config_class` instance `config` (or the defaults) with `overrides` applied.

    Args:
        config_class: the guard's frozen `*Config` dataclass.
        config: an instance of it, or None for its defaults.
        overrides: field names and values replacing those of `config`.
        where: the decorator's name, for the error message.

    Raises:
        ConfigurationError: `config` is not a `config_class`, or an override names no field
            of it (the message lists the valid names); and whatever the Config's own
            validation raises.
    """
    if config is not None and not isinstance(config, config_class):
        raise ConfigurationError(
            f"{where}: expected a {config_class.__name__}, got {type(config).__name__}",
            option="config")
    fields = [field.name for field in dataclasses.fields(config_class) if field.init]  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(fields)}",
            option=unknown[0], valid=tuple(fields))
    try:
        if config is None:
            return config_class(**overrides)
        return dataclasses.replace(config, **overrides)  # type: ignore[type-var]
    except TypeError as error:  # a required field missing
        raise ConfigurationError(f"{where}: {error}", option=None) from error


def check(config: Any, name: str, rule: str, valid: Callable[[Any], bool], label: str = "") -> None:
    """A Config's field check: `ConfigurationError("<label or name> must be <rule>, got
    <value>", field=name)` unless `valid(config.<name>)`."""
    value = getattr(config, name)
    if not valid(value):
        raise ConfigurationError(f"{label or name} must be {rule}, got {value!r}", field=name)


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
