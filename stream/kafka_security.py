"""How every Kafka client of failslow connects: the security settings (SASL PLAIN,
SCRAM-SHA-256/512, TLS with a CA file, an optional client certificate and hostname checks,
from :class:`failslow.settings.KafkaSettings`), a check that fails fast with one line, and
quiet client-library logs.

kafka-python retries a failed bootstrap until its timeout and then says only "Unable to
bootstrap"; :func:`check_connection` says why instead: the address that does not answer, a
TLS handshake that fails (an untrusted or mismatched certificate) or a SASL authentication
that the broker refuses. The password never appears in a message.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from failslow.settings import get_settings

log = logging.getLogger(__name__)

#: Loggers of the client libraries: quiet (errors only through failslow's own messages)
#: unless ``-v`` is given.
CLIENT_LOGGERS = ("kafka", "clickhouse_connect", "urllib3", "httpx", "httpcore")


class KafkaConnectError(RuntimeError):
    """Kafka cannot be used: unreachable, TLS failed or authentication failed. The message
    is one line that names the address."""


def client_security(settings: Any = None) -> dict[str, Any]:
    """The kafka-python keyword arguments of the configured security settings (whose
    secrets are then hidden from every log record)."""
    s = settings or get_settings()
    hide_secrets(s)
    return s.kafka.client_config()


#: Secret values never to appear in a log record (:func:`hide_secrets`).
_SECRETS: set[str] = set()
_factory_installed = False


def hide_secrets(settings: Any = None) -> None:
    """Replace the configured secrets (the Kafka SASL password and key password, the
    ClickHouse password, the webhook secret) by ``********`` in every log record from now
    on: kafka-python logs its whole configuration at debug level (``-vv``)."""
    global _factory_installed
    s = settings or get_settings()
    for value in (s.kafka.sasl_password, s.kafka.ssl_key_password, s.clickhouse.password,
                  s.notify.webhook_secret):
        if value is not None and len(value.get_secret_value()) >= 4:
            _SECRETS.add(value.get_secret_value())
    if _factory_installed or not _SECRETS:
        return
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad record stays as it is
            return record
        if any(secret in text for secret in _SECRETS):
            for secret in _SECRETS:
                text = text.replace(secret, "********")
            record.msg, record.args = text, None
        return record

    logging.setLogRecordFactory(factory)
    _factory_installed = True


def quiet_client_logs(verbose: bool | None = None) -> None:
    """Keep the client libraries' logs (kafka-python, clickhouse-connect, urllib3) to
    CRITICAL unless ``verbose`` (default: the root logger is at INFO or below, i.e. ``-v``),
    and never show a secret in a log (:func:`hide_secrets`)."""
    hide_secrets()
    if verbose is None:
        verbose = logging.getLogger().getEffectiveLevel() <= logging.INFO
    with contextlib.suppress(ImportError):  # it sets urllib3's level when imported
        import clickhouse_connect.driver.httputil  # noqa: F401
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.CRITICAL)


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for part in bootstrap.split(","):
        part = part.strip()
        if "://" in part:
            part = part.split("://", 1)[1]
        host, sep, port = part.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"Kafka bootstrap server {part!r}: expected host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no Kafka bootstrap server given")
    return out


def tls_context(security: Mapping[str, Any]) -> ssl.SSLContext:
    """The TLS context of ``security`` (as kafka-python builds it)."""
    ctx = ssl.create_default_context(cafile=security.get("ssl_cafile"))
    ctx.check_hostname = bool(security.get("ssl_check_hostname", True))
    if security.get("ssl_certfile"):
        ctx.load_cert_chain(security["ssl_certfile"], security.get("ssl_keyfile"),
                            security.get("ssl_password"))
    return ctx


def _tls_reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"the broker's certificate is not trusted ({e.verify_message})"
    reason = str(getattr(e, "reason", None) or type(e).__name__).replace("_", " ").lower()
    if "alert" in reason and "certificate" in reason:
        return f"the broker refused the client certificate ({reason})"
    return reason


class _Capture(logging.Handler):
    """Collects what kafka-python says about failed connections (it does not raise it)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.auth: str | None = None
        self.tls: str | None = None
        self.done = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad log record
            return
        if "AuthenticationFailed" in text or "Authentication failed" in text:
            self.auth = self.auth or "the broker refused the SASL credentials"
            if "mechanism" in text:
                mech = text.rsplit("mechanism", 1)[1].strip().split()[0].strip(".,:")
                self.auth = f"the broker refused the SASL credentials (mechanism {mech})"
            self.done.set()
        elif "UnsupportedSaslMechanism" in text or "IllegalSaslState" in text:
            self.auth = "the broker does not accept this SASL mechanism"
            self.done.set()
        elif any(w in text for w in ("Handshake failed", "CERTIFICATE_VERIFY_FAILED",
                                     "_ALERT_")):
            self.tls = self.tls or text.split("Handshake failed:", 1)[-1].strip()[:160]


@contextlib.contextmanager
def _captured() -> Iterator[_Capture]:
    logger = logging.getLogger("kafka")
    handler = _Capture()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    verbose = logging.getLogger().getEffectiveLevel() <= logging.INFO
    logger.setLevel(logging.NOTSET if verbose else logging.INFO)
    logger.propagate = verbose
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def check_connection(bootstrap: str, security: Mapping[str, Any] | None = None,
                     timeout: float = 8.0, topics: bool = False) -> list[str] | None:
    """Connect to ``bootstrap`` as the clients will (TCP, TLS, SASL) and ask for the
    topic list; raise :class:`KafkaConnectError` with one line saying what failed within
    about ``timeout`` seconds. Returns the topic names when ``topics``."""
    security = dict(client_security() if security is None else security)
    protocol = security.get("security_protocol", "PLAINTEXT")
    deadline = time.monotonic() + timeout
    reachable: tuple[str, int] | None = None
    errors = []
    for host, port in _addresses(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=min(3.0, timeout)) as sock:
                reachable = (host, port)
                if protocol in ("SSL", "SASL_SSL"):
                    try:
                        ctx = tls_context(security)
                    except (OSError, ssl.SSLError) as e:
                        raise KafkaConnectError(
                            f"Kafka TLS settings are not usable: {_tls_reason(e)}") from None
                    sock.settimeout(max(0.5, min(5.0, deadline - time.monotonic())))
                    try:
                        with ctx.wrap_socket(sock, server_hostname=host) as tls:
                            # with TLS 1.3 a refused client certificate arrives as an
                            # alert after the handshake: wait a moment for one
                            tls.settimeout(0.3)
                            with contextlib.suppress(TimeoutError, socket.timeout):
                                tls.recv(1)
                    except (ssl.SSLError, ssl.CertificateError) as e:
                        raise KafkaConnectError(
                            f"Kafka at {host}:{port}: TLS failed: {_tls_reason(e)}") from None
                    except OSError as e:
                        raise KafkaConnectError(
                            f"Kafka at {host}:{port}: TLS failed: the broker closed the "
                            f"connection during the handshake ({e.strerror or e}); is it a "
                            "TLS listener?") from None
            break
        except KafkaConnectError:
            raise
        except OSError as e:
            errors.append(f"{host}:{port} ({e.strerror or type(e).__name__})")
    if reachable is None:
        raise KafkaConnectError(f"Kafka at {bootstrap} is not reachable: "
                                + ", ".join(errors))
    from kafka import KafkaAdminClient

    from failslow.stream import kafka_compat

    kafka_compat.install()  # else a loaded client can miss the broker's refusal
    left = max(1000, int((deadline - time.monotonic()) * 1000))
    names: list[str] | None = None
    with _captured() as seen:
        made: dict[str, Any] = {}

        def bootstrap_admin() -> None:
            try:
                made["admin"] = KafkaAdminClient(
                    bootstrap_servers=bootstrap, client_id="failslow-check",
                    bootstrap_timeout_ms=left, request_timeout_ms=left,
                    reconnect_backoff_max_ms=500, **security)
            except Exception as e:  # noqa: BLE001 - reported below
                made["error"] = e
            finally:
                seen.done.set()

        # kafka-python retries a refused login until its timeout: stop waiting at the
        # first refusal it logs (the thread ends by itself at the timeout)
        threading.Thread(target=bootstrap_admin, daemon=True,
                         name="failslow-kafka-check").start()
        seen.done.wait(left / 1000 + 2)
        admin = made.get("admin")
        if admin is None:
            where = f"Kafka at {bootstrap}"
            if seen.auth:
                raise KafkaConnectError(f"{where}: authentication failed: {seen.auth}; check "
                                        "FAILSLOW_KAFKA_SASL_USERNAME, the password file "
                                        "and FAILSLOW_KAFKA_SASL_MECHANISM")
            if seen.tls:
                raise KafkaConnectError(f"{where}: TLS failed: {seen.tls}")
            kind = type(made["error"]).__name__ if "error" in made else "no answer"
            raise KafkaConnectError(f"{where} did not answer within {timeout:.0f} s "
                                    f"({kind}); is {protocol} the protocol of that "
                                    "listener?")
        try:
            if topics:
                names = list(admin.list_topics())
        except Exception as e:  # noqa: BLE001
            raise KafkaConnectError(f"Kafka at {bootstrap}: cannot list topics: "
                                    f"{type(e).__name__}: {e}") from None
        finally:
            with contextlib.suppress(Exception):
                admin.close()
    return names
