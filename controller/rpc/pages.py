"""How the operator listings of AdminService page: sizes, the byte budget, and page tokens.

Every listing answers a page at a time (`rasd.controller.store.paging`): at most `MAX_PAGE_SIZE`
items, and fewer once the page would pass `PAGE_BYTES`, so that an answer always fits a gRPC
message (rasctl and most clients keep gRPC's default 4 MiB receive limit). ``next_page_token``
says where the next page starts; a client passes it back as ``page_token``.

A token is the last item's position in the listing's order, tagged with the listing's name, as
URL-safe base64 of JSON: opaque to clients, and checked here, so a token of another listing or
one made up is INVALID_ARGUMENT, never a query of the caller's choosing.
"""

from __future__ import annotations

import base64
import binascii
import json

from rasd.controller.store import paging

MAX_PAGE_SIZE = 1000
"""Items per page at most, whatever a request asks."""
DEFAULT_PAGE_SIZE = 100
"""Items per page when a request does not say (0)."""
PAGE_BYTES = 2 * 1024 * 1024
"""A page ends before its items would pass this (about; always at least one item): half of gRPC's
default 4 MiB receive limit, which covers the estimate's error and the message's own framing."""
MAX_TOKEN_CHARS = 1024
"""A page token longer than this was not made here."""


class BadPageToken(ValueError):
    """A page_token this controller did not issue (or issued for another listing)."""


def page_size(requested: int, *, default: int = DEFAULT_PAGE_SIZE) -> int:
    """The page size for a request's limit: the default for 0, at most `MAX_PAGE_SIZE`."""
    return min(requested or default, MAX_PAGE_SIZE)


def token(listing: str, position: paging.Position | None) -> str:
    """The page token of the next page after position ("" when there is none)."""
    if position is None:
        return ""
    order, key = position
    return base64.urlsafe_b64encode(json.dumps([listing, order, key], separators=(",", ":")).encode()).decode()


def position(listing: str, page_token: str) -> paging.Position | None:
    """Where the page a token names starts (None for "": the first page).

    Raises:
        BadPageToken: not a token of this listing.
    """
    if not page_token:
        return None
    if len(page_token) > MAX_TOKEN_CHARS:
        raise BadPageToken(f"page_token: longer than {MAX_TOKEN_CHARS} characters; not a token of {listing}")
    try:
        decoded = json.loads(base64.urlsafe_b64decode(page_token.encode()))
    except (binascii.Error, UnicodeError, ValueError):
        raise BadPageToken(f"page_token: not a token of {listing}") from None
    if (
        not isinstance(decoded, list)
        or len(decoded) != 3
        or decoded[0] != listing
        or type(decoded[1]) is not int
        or not isinstance(decoded[2], int | str)
        or isinstance(decoded[2], bool)
    ):
        raise BadPageToken(f"page_token: not a token of {listing}")
    return decoded[1], decoded[2]
