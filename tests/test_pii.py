"""PII and secret scrubbing: each rule on realistic strings, code left intact, the vectorised path = the scalar one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from datalib.pii import PLACEHOLDERS, RULES, find_pii, pseudonym, scrub_frame, scrub_series, scrub_text

CASES = [
    ("email", "mail maria.gonzalez42@example.com today", "maria.gonzalez42@example.com", "<EMAIL>"),
    ("phone", "call +1 415-555-0132 now", "+1 415-555-0132", "<PHONE>"),
    ("phone", "or (212) 555-0199.", "(212) 555-0199", "<PHONE>"),
    ("phone", "uk: +44 20 7946 0958", "+44 20 7946 0958", "<PHONE>"),
    ("ipv4", "server 10.12.4.7, port 80", "10.12.4.7", "<IP>"),
    ("ipv6", "host fe80::1ff:fe23:4567:890a up", "fe80::1ff:fe23:4567:890a", "<IP>"),
    ("ipv6", "at 2001:db8::8a2e:370:7334.", "2001:db8::8a2e:370:7334", "<IP>"),
    ("api_key", "key sk-proj-abcdefghijklmnopqrstuvwx12 ok", "sk-proj-abcdefghijklmnopqrstuvwx12", "<SECRET>"),
    ("api_key", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "<SECRET>"),
    ("api_key", "aws AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", "<SECRET>"),
    ("api_key", "HF_TOKEN hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "<SECRET>"),
    ("bearer", "Authorization: Bearer 9f8e7d6c5b4a39281706f5e4", "9f8e7d6c5b4a39281706f5e4", "<SECRET>"),
    ("bearer", "curl -H 'authorization: bearer Xy7_kP2.qR9~mW4-tZ8v' x", "Xy7_kP2.qR9~mW4-tZ8v", "<SECRET>"),
    ("keyed_secret", "api_key=3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", "3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", "<SECRET>"),
    ("keyed_secret", "db_password = 'hunter22'", "hunter22", "<SECRET>"),
    ("keyed_secret", '{"client_secret": "x9y8z7w6"}', "x9y8z7w6", "<SECRET>"),
    ("internal_host", "on build-07.prod.corp:8080", "build-07.prod.corp", "<HOST>"),
    ("internal_host", "cache01.internal is down", "cache01.internal", "<HOST>"),
    ("url_credentials", "https://admin:s3cr3tpw@git.example.com/x", "admin:s3cr3tpw", "<SECRET>"),
    ("card", "card 4111 1111 1111 1111 on file", "4111 1111 1111 1111", "<CARD>"),
    ("ssn", "ssn 123-45-6789.", "123-45-6789", "<SSN>"),
    (
        "jwt",
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "<SECRET>",
    ),
    (
        "private_key",
        "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAabc\nxyz123\n-----END RSA PRIVATE KEY-----\nbye",
        "MIIEpAIBAAKCAQEAabc",
        "<SECRET>",
    ),
    ("name_field", "user: Maria Gonzalez\nplease fix", "Maria Gonzalez", "<NAME>"),
    ("name_field", "    # author: John Smith", "John Smith", "<NAME>"),
]


@pytest.mark.parametrize(
    ("kind", "text", "raw", "placeholder"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_each_rule(kind, text, raw, placeholder):
    clean = scrub_text(text)
    assert raw not in clean
    assert placeholder in clean
    assert kind in {k for k, _ in find_pii(text)}


def test_placeholders_keep_the_surrounding_text():
    assert scrub_text("user: Maria Gonzalez\nmail maria@example.com, call +1 415-555-0132.") == (
        "user: <NAME>\nmail <EMAIL>, call <PHONE>."
    )
    assert scrub_text("db_password = 'hunter22'") == "db_password = '<SECRET>'"  # still valid Python
    assert scrub_text("see http://admin:pw12345@cache01.internal/x") == "see http://<SECRET>@<HOST>/x"


def test_code_is_left_alone():
    code = (
        "import threading\n"
        "def clean(rows, name: str, key='id', sep=','):\n"
        '    """Drop rows with an empty key; dates like 2024-01-15 stay."""\n'
        "    token = tokens[0]\n"
        "    key = k.strip().lower()\n"
        "    evens = rows[1::2]\n"
        "    local = threading.local()\n"
        "    version = '1.2.3'\n"
        "    return [r for r in rows if r[key] != '' and 3.14 < r['x'] <= 1000]\n"
    )
    assert scrub_text(code) == code
    assert find_pii(code) == []
    prose = "The bearer of this token, Bearer abcdefghijklmnopqrstuv, has no digit."
    assert scrub_text(prose) == prose


def test_luhn_decides_cards():
    assert scrub_text("id 4111111111111111") == "id <CARD>"
    assert scrub_text("id 4111111111111112") == "id 4111111111111112"  # fails the Luhn check


def test_idempotent():
    for _, text, _, _ in CASES:
        once = scrub_text(text)
        assert scrub_text(once) == once


def test_series_equals_scalar_and_keeps_missing_and_index():
    texts = [c[1] for c in CASES] + ["plain text", "", None, CASES[0][1]]
    series = pd.Series(texts, index=np.arange(len(texts)) * 10, name="prompt", dtype=object)
    out = scrub_series(series)
    assert out.index.equals(series.index) and out.name == "prompt"
    expected = [None if t is None else scrub_text(t) for t in texts]
    assert out.tolist() == expected
    # The pandas default (pyarrow-backed) string dtype goes through the same path.
    assert scrub_series(series.astype("str")).tolist()[:5] == expected[:5]
    assert scrub_series(pd.Series([], dtype=object)).tolist() == []
    with pytest.raises(TypeError):
        scrub_series(pd.Series(["a@example.com", 3], dtype=object))


def test_triggers_cover_their_rules():
    """The RE2 pre-filter must flag every text a rule changes, else scrub_series would miss it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = [c[1] for c in CASES]
    arr = pa.array(texts)
    for rule in RULES:
        flagged = pc.match_substring_regex(arr, rule.trigger).to_pylist()
        for text, hit in zip(texts, flagged, strict=True):
            if rule.pattern.sub(rule.repl, text) != text:
                assert hit, (rule.kind, text)


def test_scrub_frame_only_touches_the_given_columns():
    frame = pd.DataFrame({"prompt": ["mail a.b@example.com", None], "user_id": ["a.b@example.com", "u2"], "n": [1, 2]})
    out = scrub_frame(frame, ["prompt", "user_id"])
    assert out["prompt"].tolist() == ["mail <EMAIL>", None]
    assert out["user_id"].tolist() == ["<EMAIL>", "u2"]
    assert out["n"].tolist() == [1, 2]
    assert frame["prompt"][0] == "mail a.b@example.com"  # a copy


def test_placeholders_are_not_pii():
    joined = " ".join(PLACEHOLDERS)
    assert scrub_text(joined) == joined


def test_pseudonym_is_stable_distinct_keyed_and_not_pii():
    maria = pseudonym("maria.gonzalez42@example.com", "user-")
    assert maria == pseudonym("maria.gonzalez42@example.com", "user-")  # the same user in every row and run
    assert maria.startswith("user-") and len(maria) == len("user-") + 16
    assert maria != pseudonym("Maria.Gonzalez42@example.com", "user-")  # hashed exactly as given
    assert maria != pseudonym("maria.gonzalez42@example.com", "user-", key=b"a secret key")
    ids = [f"user{i}@example.com" for i in range(2000)] + [f"+1 415-555-{i:04d}" for i in range(2000)]
    fakes = [pseudonym(v, p) for v in ids for p in ("user-", "session-", "event-")]
    assert len(set(fakes)) == len(fakes)
    assert all(scrub_text(f) == f for f in fakes)  # no rule ever rewrites a pseudonym
