"""The local broker's configuration (:mod:`failslow.infra.kafka_broker`): its
server.properties (a plain listener, and with ``infra up --secure`` a SASL_SSL one), its
log4j settings, a cluster id, and the TLS files and client password of a secure broker."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
NODE_ID = 1
#: The client of a secure broker (``infra up --secure``): SCRAM credentials made at format time.
SCRAM_USER = "failslow"
SCRAM_MECHANISM = "SCRAM-SHA-512"



def server_properties(port: int, controller_port: int, data_dir: Path, *,
                      secure_port: int | None = None, keystore: Path | None = None,
                      truststore: Path | None = None,
                      plain_password: str | None = None) -> str:
    """server.properties of a combined broker+controller bound to 127.0.0.1; with
    ``secure_port`` also a SASL_SSL listener (SCRAM-SHA-256/512, and PLAIN for user
    :data:`SCRAM_USER` with ``plain_password``; the certificate and key in the PEM file
    ``keystore``; a client certificate, when one is given, signed by the CA of the PEM
    file ``truststore``)."""
    listeners = f"PLAINTEXT://{DEFAULT_HOST}:{port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    if secure_port is not None:
        listeners += f",SASL_SSL://{DEFAULT_HOST}:{secure_port}"
        protocols += ",SASL_SSL:SASL_SSL"
    props: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": NODE_ID,
        "controller.quorum.voters": f"{NODE_ID}@{DEFAULT_HOST}:{controller_port}",
        "listeners": f"{listeners},CONTROLLER://{DEFAULT_HOST}:{controller_port}",
        "advertised.listeners": listeners,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        "log.dirs": str(data_dir),
        "num.partitions": 1,
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 10,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 4,
        "group.initial.rebalance.delay.ms": 0,
        "num.network.threads": 2,
        "num.io.threads": 4,
        "num.recovery.threads.per.data.dir": 1,
        "message.max.bytes": 8 * 1024 * 1024,
        "log.retention.hours": 24,
        "log.segment.bytes": 64 * 1024 * 1024,
        "log.retention.check.interval.ms": 60_000,
    }
    if secure_port is not None:
        if keystore is None:
            raise ValueError("a SASL_SSL listener needs a keystore")
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        lst = "listener.name.sasl_ssl"
        mechanisms = "SCRAM-SHA-256,SCRAM-SHA-512"
        props.update({
            f"{lst}.scram-sha-256.sasl.jaas.config": scram,
            f"{lst}.scram-sha-512.sasl.jaas.config": scram,
            f"{lst}.ssl.keystore.type": "PEM",
            f"{lst}.ssl.keystore.location": str(keystore),
        })
        if truststore is not None:  # a client certificate is optional, but if one is
            props.update({  # given it must be signed by this CA (mutual TLS)
                f"{lst}.ssl.truststore.type": "PEM",
                f"{lst}.ssl.truststore.location": str(truststore),
                f"{lst}.ssl.client.auth": "requested"})
        else:
            props[f"{lst}.ssl.client.auth"] = "none"
        if plain_password is not None:  # the file is the owner's only (kafka_up)
            mechanisms += ",PLAIN"
            props[f"{lst}.plain.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{SCRAM_USER}="{plain_password}";')
        props["sasl.enabled.mechanisms"] = mechanisms
    return "".join(f"{k}={v}\n" for k, v in props.items())


LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.org.apache.kafka.controller=WARN
log4j.logger.kafka.log.LogCleaner=WARN
"""


def _cluster_id() -> str:
    """A random cluster id in Kafka's format (URL-safe base64 of 16 bytes, no padding), not
    starting with '-' (the storage tool would read it as an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def _secure_files(sd: Path) -> dict[str, Path]:
    tls = sd / "tls"
    return {"dir": tls, "ca": tls / "ca.pem", "keystore": tls / "server-keystore.pem",
            "password": tls / "client.password", "scram": sd / "data" / ".scram"}


def _secure_setup(sd: Path) -> dict[str, Path]:
    """The CA, the server certificate and the client password of a secure broker (made
    once per state directory; the password file is readable by its owner only)."""
    import secrets

    from failslow.infra.tls import make_server_cert

    sec = _secure_files(sd)
    if not (sec["ca"].exists() and sec["keystore"].exists()):
        try:
            make_server_cert(sec["dir"])
        except ImportError as e:  # pragma: no cover - cryptography is in the test extra
            from failslow.infra.kafka_broker import InfraError

            raise InfraError("infra up --secure needs the cryptography package: "
                             "pip install cryptography") from e
    if not sec["password"].exists():
        sec["dir"].mkdir(parents=True, exist_ok=True)
        fd = os.open(sec["password"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24) + "\n")
    return sec
