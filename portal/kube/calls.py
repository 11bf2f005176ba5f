"""What every unparsed apiserver call needs."""

from __future__ import annotations

from typing import Any


def drain(response: Any) -> None:
    """Read the body of a call made with ``_preload_content=False`` whose answer is not used.

    Unread, its connection never goes back to the client's pool: the next call opens a new
    one (a TLS handshake), which on a busy apiserver costs more than the call itself.
    """
    response.read()
    response.release_conn()
