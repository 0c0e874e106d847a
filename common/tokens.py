"""Bearer tokens for rasctl: how one is made and the form it is stored in (the controller's token file).

Tokens are 32 random bytes, so one SHA-256 is enough at rest: a salted slow hash protects guessable
passwords, and nobody guesses 256 random bits. The controller compares digests in constant time.
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "rasd_"


def new_token() -> str:
    """A fresh random bearer token (256 bits), recognisable by its prefix in a leaked log."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    """Hex SHA-256 of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def hash_token(token: str) -> str:
    """The at-rest form of a token, as written in the token file."""
    return "sha256:" + digest(token)
