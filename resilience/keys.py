"""Canonical keys from task arguments, and the Redis key names built from them.

`f(1)`, `f(a=1)` and `f()` with `a=1` as default give one key: arguments are bound to the
signature, defaults applied, and written as canonical JSON. Other values are refused rather
than stringified: `str()` of an object is not stable across processes and would split or
merge keys. `redis_key`: see docs/pipeline.md.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

from kombu.utils.json import JSONEncoder
from kombu.utils.json import object_hook as kombu_object_hook

from resilience.errors import ArgumentsDoNotBind, ConfigurationError, InvalidKey, NonJsonArguments

#: Longest key a guard accepts, in characters; longer user keys are an error, not truncated.
MAX_KEY_LENGTH = 512

KeyOption = str | Callable[..., Any] | None


# Built once (`json.dumps` with options builds one per call); encoders are stateless.
_CANONICAL = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False,
              "allow_nan": False}
_PLAIN_ENCODER = json.JSONEncoder(**_CANONICAL)  # type: ignore[arg-type]
_CELERY_ENCODER = JSONEncoder(**_CANONICAL)  # type: ignore[arg-type]


def canonical_json(value: Any) -> str:
    """Serialize `value` to canonical JSON, refusing anything that is not plain JSON.

    Raises:
        NonJsonArguments: `value` holds a type JSON cannot carry (set, bytes, object, NaN).
    """
    try:
        return _PLAIN_ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise NonJsonArguments(
            f"arguments must be JSON-serializable (str, int, float, bool, None, list, dict "
            f"with str keys): {exc}", cause=repr(exc)) from None


def canonical_arguments(value: Any) -> str:
    """Canonical JSON of task arguments, with the types Celery's JSON serializer carries.

    kombu tags `UUID`, `datetime`, `Decimal`, ... so a producer's key from a `UUID` equals
    the worker's, and differs from the key of its string.

    Raises:
        NonJsonArguments: `value` holds a type the JSON serializer cannot carry.
    """
    try:
        return _CELERY_ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise NonJsonArguments(
            f"arguments must be what Celery's JSON serializer carries (str, int, float, bool, "
            f"None, list, dict, UUID, datetime, date, time, Decimal): {exc}",
            cause=repr(exc)) from None


def revive(value: Any) -> Any:
    """`value` with kombu's tagged values turned back into `UUID`, `Decimal`, ... as Celery's
    JSON decoder does: a replayed result equals what the first call returned."""
    if isinstance(value, dict):
        if value.keys() == _TAGGED:
            return kombu_object_hook(value)
        return {name: revive(item) for name, item in value.items()}
    if isinstance(value, list):
        return [revive(item) for item in value]
    return value


_TAGGED = {"__type__", "__value__"}


@lru_cache(maxsize=1024)
def _cached_signature(func: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(func)


def signature_of(func: Callable[..., Any]) -> inspect.Signature:
    """`inspect.signature`, computed once per function (it costs more than the binding)."""
    try:
        return _cached_signature(func)
    except TypeError:  # an unhashable callable object
        return inspect.signature(func)


def check_binding(func: Callable[..., Any], args: tuple[Any, ...] | list[Any],
                  kwargs: Mapping[str, Any]) -> None:
    """Raise `ArgumentsDoNotBind` unless `args`/`kwargs` fit `func`'s signature."""
    bind_arguments(func, args, kwargs)


_Plain = tuple[tuple[str, ...], int, dict[str, Any]]
_plain: dict[Any, _Plain | None] = {}
_PLAIN_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _plain_signature(func: Callable[..., Any]) -> _Plain | None:
    """A plain signature's (named parameters only: no `*args`, `**kwargs` or positional-only)
    parameter names in order, how many may be positional, and the defaults; None for other
    signatures."""
    # A bound method's signature drops its first parameter: key on the function and that.
    key = (getattr(func, "__func__", func), hasattr(func, "__self__"))
    try:
        return _plain[key]
    except KeyError:
        pass
    except TypeError:  # unhashable callable
        return None
    found: _Plain | None = None
    try:
        parameters = list(signature_of(func).parameters.values())
    except (TypeError, ValueError):
        parameters = None
    if parameters is not None and all(p.kind in _PLAIN_KINDS for p in parameters):
        found = (tuple(p.name for p in parameters),
                 sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters),
                 {p.name: p.default for p in parameters
                  if p.default is not inspect.Parameter.empty})
    if len(_plain) < 4096:
        _plain[key] = found
    return found


def bind_arguments(
    func: Callable[..., Any], args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Bind `args`/`kwargs` to `func`'s signature with defaults applied, by parameter name.

    Raises:
        ArgumentsDoNotBind: the arguments do not fit the signature.
    """
    plain = _plain_signature(func)
    if plain is not None:
        # A plain signature (named parameters only) binds without `Signature.bind`, which
        # costs more than the rest of a key; anything unusual takes the full path below.
        names, positional, defaults = plain
        count = len(args)
        if count <= positional:
            arguments = dict(zip(names, args, strict=False))
            used = 0
            for name in names[count:]:
                if name in kwargs:
                    arguments[name] = kwargs[name]
                    used += 1
                elif name in defaults:
                    arguments[name] = defaults[name]
                else:
                    break  # a required argument is missing: the full path says which
            else:
                if used == len(kwargs):  # otherwise an unknown or a repeated name
                    return arguments
    signature = signature_of(func)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(func, "__name__", repr(func))
        raise ArgumentsDoNotBind(
            f"arguments do not match {name}{signature}: {exc}", signature=str(signature)) from None
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
    """A key for one task's guard: `namespace` (the task name) plus `value`; `fingerprint`
    digests all bound arguments ("same key, different arguments")."""

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
            accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
            for _, field, _, _ in string.Formatter().parse(key):
                if field is None:
                    continue
                root = field.split(".")[0].split("[")[0]
                if not root or root.isdigit():
                    raise ConfigurationError(
                        f"key template {key!r} must name arguments, e.g. '{{order_id}}'")
                if root not in parameters and not accepts_any:
                    raise ConfigurationError(
                        f"key template {key!r} names {root!r}, which is not an argument of "
                        f"{func.__name__}{inspect.signature(func)}",
                        argument=root)
        elif key is not None and not callable(key):
            raise ConfigurationError(
                f"key must be None, a template string or a callable, not {type(key).__name__}")

    def build(
        self, namespace: str, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]
    ) -> GuardKey:
        """Derive the key of one call (raises ArgumentsDoNotBind, NonJsonArguments, InvalidKey)."""
        arguments = bind_arguments(self.func, args, kwargs)
        canonical = canonical_arguments(arguments)
        digest = fingerprint(canonical)
        return GuardKey(namespace=namespace, value=self._value(arguments, canonical, digest),
                        fingerprint=digest)

    def value(self, args: tuple[Any, ...] | list[Any], kwargs: Mapping[str, Any]) -> str:
        """`build(...).value`, without the fingerprint when a template or a function makes
        the key (the enqueue path's keys)."""
        arguments = bind_arguments(self.func, args, kwargs)
        if self.key is None:
            canonical = canonical_arguments(arguments)
            return self._value(arguments, canonical, fingerprint(canonical))
        return self._value(arguments, "", "")

    def _value(self, arguments: dict[str, Any], canonical: str, digest: str) -> str:
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
                    value = canonical_arguments(produced)
                except NonJsonArguments:
                    raise InvalidKey(
                        f"key function returned {type(produced).__name__}, which is not JSON; "
                        "return a string or plain JSON values") from None
        if not value:
            raise InvalidKey("a guard key must not be empty")
        if len(value) > MAX_KEY_LENGTH:
            raise InvalidKey(
                f"key of {len(value)} characters exceeds {MAX_KEY_LENGTH}; use a key function "
                "that picks the identifying arguments",
                length=len(value))
        return value


# -- Redis key names ----------------------------------------------------------------------
#: Longest encoded user part kept readable; a longer one is replaced by its digest.
MAX_ENCODED_PART_LENGTH = 200

#: Characters escaped in a user part: `:`, the hash-tag braces, `%`, `#` (marks a digest),
#: glob characters (SCAN patterns), whitespace, control and invisible characters, lone
#: surrogates. A fixed list, not Unicode categories: the encoding must not change with the
#: Python version, or one fleet would name the same key differently.
_UNSAFE_BUT_COLON = (
    "\x00-\x20\x7f-\xa0%{}#*?\\[\\]\\\\\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u206f"
    "\u3000\ufeff\ud800-\udfff")
_UNSAFE = re.compile(f"[:{_UNSAFE_BUT_COLON}]")
_UNSAFE_OTHER_THAN_COLON = re.compile(f"[{_UNSAFE_BUT_COLON}]")
_DIGEST_MARK = "#"


def _percent(match: re.Match[str]) -> str:
    return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8", "surrogatepass"))


def encode_key_part(user: str) -> str:
    """`user` as one part of a Redis key name: percent-encoded (never `:`, `{`, `}` or a
    bare `%`, so it cannot end a hash tag or borrow another key's suffix), or `#<sha256 hex>`
    when longer than `MAX_ENCODED_PART_LENGTH` (no encoded value starts with `#`).

    Raises:
        InvalidKey: `user` is empty or not a string.
    """
    if not isinstance(user, str) or not user:
        raise InvalidKey(f"a Redis key part must be a non-empty string, got {user!r}")
    if _UNSAFE_OTHER_THAN_COLON.search(user) is None:
        encoded = user.replace(":", "%3A")  # the common case (`name:value`), 10x faster
    else:
        encoded = _UNSAFE.sub(_percent, user)
    if len(encoded) <= MAX_ENCODED_PART_LENGTH:
        return encoded
    digest = hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()
    return _DIGEST_MARK + digest


def decode_key_part(encoded: str) -> str:
    """The value `encode_key_part` encoded, for admin views; a digest comes back as stored."""
    if encoded.startswith(_DIGEST_MARK) or "%" not in encoded:
        return encoded
    return unquote(encoded, encoding="utf-8", errors="surrogatepass")


def _check_constant(kind: str, text: str) -> None:
    if not text or "{" in text or "}" in text:
        raise ConfigurationError(
            f"a Redis key {kind} must be non-empty and hold no '{{' or '}}' (it would move "
            f"the key's hash tag), got {text!r}")


def redis_key(namespace: str, user: str, *suffixes: str) -> str:
    """The Redis key `namespace:{<encoded user>}[:suffix...]` of guard state.

    Only `user` comes from a task or configuration; the encoded part holds no `:` (no value
    names another's suffixed key) and is the Cluster hash tag (one slot per value).

    Raises:
        InvalidKey: `user` is empty.  ConfigurationError: a constant holds `{` or `}`.
    """
    _check_constant("namespace", namespace)
    key = f"{namespace}:{{{encode_key_part(user)}}}"
    for suffix in suffixes:
        _check_constant("suffix", suffix)
        key = f"{key}:{suffix}"
    return key


def redis_key_pattern(namespace: str) -> str:
    """SCAN pattern matching every key `redis_key(namespace, ...)` makes."""
    _check_constant("namespace", namespace)
    return re.sub(r"([*?\[\]\\])", r"\\\1", namespace) + ":{*"


def parse_redis_key(namespace: str, key: str) -> tuple[str, tuple[str, ...]] | None:
    """(decoded user value, suffixes) of a key `redis_key(namespace, ...)` made, else None."""
    head = f"{namespace}:{{"
    if not key.startswith(head):
        return None
    part, brace, rest = key[len(head):].partition("}")
    if not brace or not part or (rest and not rest.startswith(":")):
        return None
    suffixes = tuple(rest[1:].split(":")) if rest else ()
    return decode_key_part(part), suffixes


#: Keys asked of Redis per SCAN step when listing a namespace (admin views, describe()).
SCAN_COUNT = 500


def stored_keys(client: Any, namespace: str, *, suffixed: bool = False) -> dict[str, str]:
    """Redis key -> decoded user value of every key `redis_key(namespace, value)` made, by
    one SCAN (admin views, never a job's path); suffixed keys only if `suffixed`."""
    found = {}
    for key in client.scan_iter(match=redis_key_pattern(namespace), count=SCAN_COUNT):
        parsed = parse_redis_key(namespace, key)
        if parsed is not None and (suffixed or not parsed[1]):
            found[key] = parsed[0]
    return found
