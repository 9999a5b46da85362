"""KV events over ZeroMQ in vLLM's wire format: decoding, publishing and subscribing.

Needs the ``kvevents`` extra (pyzmq and msgspec): ``pip install 'kvgate[kvevents]'``.
``kvgate.kvevents.wire`` says what the format is; the index the events feed is pure
(``kvgate.core.exact_index``).
"""

from __future__ import annotations

MISSING_EXTRA = (
    "KV events need pyzmq and msgspec: install kvgate with the 'kvevents' extra "
    "(pip install 'kvgate[kvevents]')"
)
"""The error a configuration naming ``kv_events`` gets when the extra is not installed."""


def available() -> bool:
    """Whether pyzmq and msgspec are importable."""
    try:
        import msgspec  # noqa: F401
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True
