"""Redis key names from user values: no collision, one hash slot per value, bounded length."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilience.errors import ConfigurationError, InvalidKey
from resilience.keys import (
    MAX_ENCODED_PART_LENGTH,
    decode_key_part,
    encode_key_part,
    parse_redis_key,
    redis_key,
    redis_key_pattern,
)

#: Any Python string, lone surrogates included (a str from JSON may hold one).
ANY_TEXT = st.text(st.characters(exclude_categories=()), min_size=1, max_size=300)


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes: the text between the first `{` and the next `}`."""
    start = key.index("{")
    end = key.index("}", start + 1)
    assert end > start + 1, "an empty hash tag hashes the whole key"
    return key[start + 1 : end]


class TestEncodeKeyPart:
    def test_plain_value_stays_readable(self) -> None:
        """Letters, digits, dots, dashes and non-ASCII letters are kept as they are."""
        assert encode_key_part("tasks.pay-42") == "tasks.pay-42"
        assert encode_key_part("café-日本") == "café-日本"

    @pytest.mark.parametrize(
        ("value", "encoded"),
        [
            ("acme:waiting", "acme%3Awaiting"),
            ("a{b}c", "a%7Bb%7Dc"),
            ("100%", "100%25"),
            ("#tag", "%23tag"),
            ("two words\n", "two%20words%0A"),
            ("zero\u200bwidth", "zero%E2%80%8Bwidth"),
            ("glob*?[x]\\", "glob%2A%3F%5Bx%5D%5C"),
        ],
    )
    def test_separators_and_invisible_characters_are_escaped(self, value: str,
                                                             encoded: str) -> None:
        """`:`, braces, `%`, `#`, glob characters, whitespace and invisible ones are escaped."""
        assert encode_key_part(value) == encoded
        assert decode_key_part(encoded) == value

    def test_long_value_becomes_a_fixed_length_digest(self) -> None:
        """A value whose encoded form exceeds the limit is `#<sha256 hex>` (65 characters)."""
        long = "x" * 5000
        encoded = encode_key_part(long)
        assert encoded.startswith("#") and len(encoded) == 65
        assert encode_key_part(long + "y") != encoded
        assert decode_key_part(encoded) == encoded

    def test_limit_applies_to_the_encoded_form(self) -> None:
        """At the limit a value is kept; escapes count, so fewer raw characters fit."""
        assert encode_key_part("x" * MAX_ENCODED_PART_LENGTH) == "x" * MAX_ENCODED_PART_LENGTH
        assert encode_key_part(":" * 67).startswith("#")  # 67 * 3 = 201 characters

    @pytest.mark.parametrize("value", ["", None, 42])
    def test_empty_or_non_string_is_refused(self, value: object) -> None:
        """An empty part would make an empty hash tag; a non-string has no stable spelling."""
        with pytest.raises(InvalidKey):
            encode_key_part(value)  # type: ignore[arg-type]

    @given(ANY_TEXT)
    def test_round_trip_and_no_separator_survives(self, value: str) -> None:
        """For any string: no `:`/`{`/`}` in the part, and it decodes back (or is a digest)."""
        encoded = encode_key_part(value)
        assert not set(encoded) & set(":{}")
        assert re.fullmatch(r"(?:[^%]|%[0-9A-F]{2})*", encoded)  # every % starts an escape
        assert len(encoded) <= MAX_ENCODED_PART_LENGTH
        if not encoded.startswith("#"):
            assert decode_key_part(encoded) == value

    @given(ANY_TEXT, ANY_TEXT)
    def test_distinct_values_give_distinct_parts(self, first: str, second: str) -> None:
        """The encoding is injective: two values never share a key."""
        if first != second:
            assert encode_key_part(first) != encode_key_part(second)


class TestRedisKey:
    def test_layout(self) -> None:
        """`namespace:{encoded}` plus `:suffix` per suffix."""
        assert redis_key("resilience:limits:gcra", "acme") == "resilience:limits:gcra:{acme}"
        assert (redis_key("resilience:limits:gcra", "acme", "waiting")
                == "resilience:limits:gcra:{acme}:waiting")

    def test_user_value_cannot_name_a_suffixed_key(self) -> None:
        """`acme:waiting` is not acme's waiting line (the old layout made them one key)."""
        waiting_line = redis_key("resilience:limits:gcra", "acme", "waiting")
        assert redis_key("resilience:limits:gcra", "acme:waiting") != waiting_line
        assert redis_key("resilience:limits:gcra", "acme}:waiting") != waiting_line

    @given(ANY_TEXT)
    def test_keys_of_one_value_share_a_hash_slot(self, value: str) -> None:
        """A limiter and its waiting line have the same non-empty hash tag."""
        plain = redis_key("ns", value)
        assert hash_tag(plain) == hash_tag(redis_key("ns", value, "waiting"))
        assert hash_tag(plain) == encode_key_part(value)

    def test_long_value_gives_a_short_key(self) -> None:
        """A 5,000-character value makes a key of namespace + 67 characters."""
        key = redis_key("resilience:breaker", "b" * 5000, "window")
        assert len(key) == len("resilience:breaker:{}") + 65 + len(":window")

    @pytest.mark.parametrize("namespace", ["", "ns{x}", "ns}"])
    def test_namespace_with_braces_is_refused(self, namespace: str) -> None:
        """A brace in the code's own part would move the hash tag."""
        with pytest.raises(ConfigurationError):
            redis_key(namespace, "value")

    def test_suffix_with_braces_is_refused(self) -> None:
        with pytest.raises(ConfigurationError):
            redis_key("ns", "value", "{x}")


class TestParseRedisKey:
    @given(ANY_TEXT)
    def test_parse_inverts_redis_key(self, value: str) -> None:
        """Admin views get the value back from a scanned key (a long one as its digest)."""
        parsed = parse_redis_key("resilience:breaker", redis_key("resilience:breaker", value,
                                                                 "window"))
        assert parsed == (decode_key_part(encode_key_part(value)), ("window",))

    @pytest.mark.parametrize(
        "key",
        ["resilience:breaker:old-layout", "resilience:budget:{x}", "resilience:breaker:{}",
         "resilience:breaker:{x}junk", "resilience:breaker:{x"],
    )
    def test_foreign_keys_are_not_parsed(self, key: str) -> None:
        """Another namespace, the old layout or a broken key gives None."""
        assert parse_redis_key("resilience:breaker", key) is None

    def test_scan_pattern_escapes_glob_characters(self) -> None:
        assert redis_key_pattern("resilience:breaker") == "resilience:breaker:{*"
        assert redis_key_pattern("test:[a]*") == "test:\\[a\\]\\*:{*"
