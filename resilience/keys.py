"""Canonical keys from task arguments, shared by every guard that keys on arguments.

`f(1)`, `f(a=1)` and `f()` with `a=1` as default produce the same key: arguments are bound
to the function's signature, defaults applied, then written as canonical JSON (sorted keys,
no whitespace). Non-JSON values are refused rather than stringified, because `str()` of an
object is not stable across processes and would silently split or merge keys.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from resilience.errors import ArgumentsDoNotBind, ConfigurationError, InvalidKey, NonJsonArguments

#: Longest key a guard accepts, in characters; longer user keys are an error, not truncated.
MAX_KEY_LENGTH = 512

KeyOption = str | Callable[..., Any] | None


def canonical_json(value: Any) -> str:
    """Serialize `value` to canonical JSON, refusing anything that is not plain JSON.

    Raises:
        NonJsonArguments: `value` holds a type JSON cannot carry (set, bytes, object, NaN).
    """
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise NonJsonArguments(
            f"arguments must be JSON-serializable (str, int, float, bool, None, list, dict "
            f"with str keys): {exc}",
            cause=repr(exc),
        ) from None


@lru_cache(maxsize=1024)
def _cached_signature(func: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(func)


def _signature(func: Callable[..., Any]) -> inspect.Signature:
    """`inspect.signature`, computed once per function (it costs more than the binding)."""
    try:
        return _cached_signature(func)
    except TypeError:  # an unhashable callable object
        return inspect.signature(func)


def bind_arguments(
    func: Callable[..., Any], args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Bind `args`/`kwargs` to `func`'s signature with defaults applied, by parameter name.

    Raises:
        ArgumentsDoNotBind: the arguments do not fit the signature.
    """
    signature = _signature(func)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(func, "__name__", repr(func))
        raise ArgumentsDoNotBind(
            f"arguments do not match {name}{signature}: {exc}", signature=str(signature)
        ) from None
    bound.apply_defaults()
    arguments: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            arguments[name] = list(value)
        else:
            arguments[name] = value
    return arguments


def fingerprint(canonical: str) -> str:
    """A stable digest of canonical JSON, used to compare arguments without storing them twice."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class GuardKey:
    """A key for one task's guard: `namespace` (the task name) plus `value`.

    `fingerprint` digests all bound arguments, so a guard can tell "same key, same call"
    from "same key, different arguments".
    """

    namespace: str
    value: str
    fingerprint: str

    @property
    def full(self) -> str:
        """The key as stored: `namespace:value`."""
        return f"{self.namespace}:{self.value}"

    def __str__(self) -> str:
        return self.full


class KeySpec:
    """How a guard derives its key from a call: all arguments, a template, or a function.

    Args:
        func: the task's function (its signature is used for binding).
        key: None for all bound arguments; a `str.format` template such as
            ``"order:{order_id}"``; or a callable receiving the bound arguments as keywords.

    Raises:
        ConfigurationError: a template names an argument the function does not have.
    """

    def __init__(self, func: Callable[..., Any], key: KeyOption = None) -> None:
        self.func = func
        self.key = key
        if isinstance(key, str):
            parameters = inspect.signature(func).parameters
            accepts_any = any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
            )
            for _, field, _, _ in string.Formatter().parse(key):
                if field is None:
                    continue
                root = field.split(".")[0].split("[")[0]
                if not root or root.isdigit():
                    raise ConfigurationError(
                        f"key template {key!r} must name arguments, e.g. '{{order_id}}'"
                    )
                if root not in parameters and not accepts_any:
                    raise ConfigurationError(
                        f"key template {key!r} names {root!r}, which is not an argument of "
                        f"{func.__name__}{inspect.signature(func)}",
                        argument=root,
                    )
        elif key is not None and not callable(key):
            raise ConfigurationError(
                f"key must be None, a template string or a callable, not {type(key).__name__}"
            )

    def build(
        self, namespace: str, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]
    ) -> GuardKey:
        """Derive the key of one call.

        Raises:
            ArgumentsDoNotBind, NonJsonArguments, InvalidKey.
        """
        arguments = bind_arguments(self.func, args, kwargs)
        canonical = canonical_json(arguments)
        digest = fingerprint(canonical)
        if self.key is None:
            value = canonical if len(canonical) <= 128 else f"sha256:{digest}"
        elif isinstance(self.key, str):
            try:
                value = self.key.format(**arguments)
            except (KeyError, IndexError, AttributeError) as exc:
                raise InvalidKey(f"key template {self.key!r} cannot be filled: {exc}") from None
        else:
            produced = self.key(**arguments)
            if isinstance(produced, str):
                value = produced
            else:
                try:
                    value = canonical_json(produced)
                except NonJsonArguments:
                    raise InvalidKey(
                        f"key function returned {type(produced).__name__}, which is not JSON; "
                        "return a string or plain JSON values"
                    ) from None
        if not value:
            raise InvalidKey("a guard key must not be empty")
        if len(value) > MAX_KEY_LENGTH:
            raise InvalidKey(
                f"key of {len(value)} characters exceeds {MAX_KEY_LENGTH}; use a key function "
                "that picks the identifying arguments",
                length=len(value),
            )
        return GuardKey(namespace=namespace, value=value, fingerprint=digest)
