"""GitHub webhook signatures (X-Hub-Signature-256: HMAC-SHA256 of the raw body)."""
from __future__ import annotations

import hashlib
import hmac


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Constant-time check; a missing or malformed header is simply invalid."""
    if not header or not header.startswith("sha256="):
        return False
    # Bytes, not str: compare_digest raises on non-ASCII str, and a forged header must just be invalid.
    return hmac.compare_digest(sign(secret, body).encode(), header.strip().encode("utf-8", "surrogateescape"))
