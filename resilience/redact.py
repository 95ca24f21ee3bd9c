"""Passwords out of messages: URLs and credentials are redacted before they are shown or logged.

A configuration error quotes the value it refused, and a refused URL is the one most likely
to be malformed (`redis//:pw@host`), so redaction cannot lean on a URL parser. It works on
the shape `[scheme://][user][:password]@host`: the scheme, user and host stay (what an
operator needs to find the mistake), the password becomes `***`. Parameters that name a
secret (`?password=...`, `password=...` in a libpq DSN, `auth_token=...`) are masked too.

    >>> redact_url("redis//:hunter2@cache:6379/0")
    'redis//:***@cache:6379/0'
    >>> redact("REDIS_URL: 'amqp://ops:s3cret@mq//' is not a Redis URL")
    "REDIS_URL: 'amqp://ops:***@mq//' is not a Redis URL"

When unsure, more is masked rather than less: everything up to the last `@` of a URL counts
as its user information. In free text a URL ends at whitespace (a URL cannot hold a raw
space); `redact_url` on one value has no such limit.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "redact", "redact_url"]

#: What a password is replaced with.
MASK = "***"

# A scheme, also when malformed (`redis//`, `redis:/`), not inside a word or after a colon:
# in `user:pw//x@host` the `pw//` is part of the password, not a scheme.
_SCHEME = re.compile(r"(?<![\w:+.\-])[A-Za-z][A-Za-z0-9+.\-]*(?::/{1,3}|/{2,3})")

# `password=...`, `?passwd=...&`, `auth_token="..."`: a key naming a secret, then its value.
_SECRET_PARAMETER = re.compile(
    r"""(?ix)
    (\b[\w.\-]*(?:pass|pwd|secret|token|auth|api[_\-]?key|credential)[\w.\-]*\s*=\s*)
    ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;'"]+)
    """)

# Where a comma-separated list of URLs (REDLOCK_URLS) starts its next URL.
_NEXT_URL = re.compile(r",(?=[A-Za-z][A-Za-z0-9+.\-]*(?::/|//))")


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***`; scheme, user and host kept.

    Works on malformed URLs too (`redis//:pw@host`, `user:pw@host`), and masks secret query
    parameters (`?password=...`). A string without credentials is returned unchanged.
    """
    url = _SECRET_PARAMETER.sub(lambda m: m.group(1) + MASK, url)
    at = url.rfind("@")
    if at < 0:
        return url
    scheme = _SCHEME.search(url, 0, at)
    start = scheme.end() if scheme else 0
    user, colon, _password = url[start:at].partition(":")
    if not colon:
        return url  # a user name alone (`postgresql://app@db/jobs`) is no secret
    return f"{url[:start]}{user}:{MASK}{url[at:]}"


def redact(text: str) -> str:
    """`text` with the password of every URL, and every secret parameter, replaced by `***`."""
    text = _SECRET_PARAMETER.sub(lambda m: m.group(1) + MASK, text)
    return re.sub(r"\S*@\S*", lambda m: _redact_word(m.group(0)), text)


def _redact_word(word: str) -> str:
    return ",".join(redact_url(part) for part in _NEXT_URL.split(word))
