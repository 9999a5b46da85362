"""Header lookups for session keys: any case, any mapping."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from kvgate.core.session import header_value


def test_header_value_ignores_case_in_every_kind_of_mapping() -> None:
    plain = {"x-session-id": "a", "Content-Type": "application/json"}
    for headers in (plain, CIMultiDict(plain), CIMultiDictProxy(CIMultiDict(plain))):
        assert header_value(headers, "X-Session-ID") == "a"
        assert header_value(headers, "content-type") == "application/json"
        assert header_value(headers, "X-Priority") is None
