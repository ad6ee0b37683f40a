"""Sending one page (:mod:`failslow.dashboards.notify`): the outbox record, the HTTP POST
(httpx) and how its result counts for the retry policy, the signature headers and the
per-receiver rate limit.

Retries are not a loop here: a failed delivery stays in the notifier's durable outbox with
the time of its next attempt (:meth:`failslow.dashboards.notify_config.Retry.delay`, at least
the receiver's ``Retry-After``), so the notifier keeps consuming while a receiver is down and a
restart resumes the schedule. :func:`http_post` only classifies: timeouts, connection errors,
408, 429 and 5xx are worth a retry, other statuses are not.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

USER_AGENT = "failslow-notify/1"
SIGNATURE_HEADER = "X-Failslow-Signature"
TIMESTAMP_HEADER = "X-Failslow-Timestamp"
DELIVERY_HEADER = "X-Failslow-Delivery"
#: HTTP statuses after which the same request may succeed later.
RETRY_STATUSES = frozenset({408, 429})


@dataclass
class Delivery:
    """One notice for one receiver, in the outbox until acknowledged."""

    id: str
    receiver: str
    key: str
    event: str
    notice: dict[str, Any]
    attempts: int = 0
    next_at: float = 0.0
    created: float = 0.0
    last_error: str = ""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    retry: bool
    status: int | None
    error: str = ""
    retry_after: float | None = None


Poster = Callable[[str, bytes, Mapping[str, str], float], Outcome]


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


def http_post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
    """POST ``body``; classify the result for the retry policy (a 2xx is acknowledged)."""
    try:
        resp = httpx.post(url, content=body, headers=dict(headers), timeout=timeout)
    except (httpx.TransportError, OSError) as e:  # timeouts, refused, reset, bad URL
        return Outcome(False, True, None, f"{type(e).__name__}: {e}")
    if resp.is_success:
        return Outcome(True, False, resp.status_code)
    code = resp.status_code
    return Outcome(False, retryable_status(code), code, f"HTTP {code}",
                   _retry_after(resp.headers.get("Retry-After")))


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (an HTTP date is not honoured)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(secret: bytes, timestamp: str, body: bytes, signature: str,
                     max_age_s: float | None = 300.0, now: float | None = None) -> bool:
    """What a receiver does: constant-time compare, and reject stale timestamps."""
    if max_age_s is not None:
        try:
            age = abs((time.time() if now is None else now) - float(timestamp))
        except ValueError:
            return False
        if age > max_age_s:
            return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


def request_headers(delivery_id: str, body: bytes, secret: bytes | None,
                    now: float) -> dict[str, str]:
    """The headers of one attempt: the delivery id (the same on every retry, so a receiver
    can drop duplicates) and, with a secret, the timestamp and its HMAC signature."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               DELIVERY_HEADER: delivery_id}
    if secret is not None:
        stamp = str(int(now))
        headers[TIMESTAMP_HEADER] = stamp
        headers[SIGNATURE_HEADER] = sign(secret, stamp, body)
    return headers


class TokenBucket:
    """``rate_per_minute`` tokens per minute, at most ``burst`` saved up."""

    def __init__(self, rate_per_minute: float, burst: int, now: float) -> None:
        self.rate = rate_per_minute / 60.0
        self.burst = float(burst)
        self.tokens = float(burst)
        self.t = now

    def take(self, now: float) -> float:
        """0 when a token was taken, else seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate
