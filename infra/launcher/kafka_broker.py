"""Local servers for the stream path: a one-node Apache Kafka broker without Docker.

The live pipeline of the design (README, Architecture) carries events from node agents to the
stream processor through Kafka topics. ``docker compose up`` starts a broker; this module
starts the same broker (Apache Kafka 3.9.1, KRaft: one process is both broker and controller,
no ZooKeeper) straight from Maven Central's jars on a machine that has Java and Maven but no
Docker, and is what the Kafka tests use:

    failslow infra up [--port 9092]     fetch the jars if missing, format, start, wait until ready
    failslow infra status               running or not, on which port, until when
    failslow infra down                 SIGTERM, then SIGKILL after a timeout

The commands are :mod:`failslow.cli.infra` (``infra/kafka/kafka.sh`` runs them). The broker
listens on 127.0.0.1 only. It stops by itself after ``--max-lifetime`` seconds (coreutils
``timeout`` is its parent), so a broker that nobody stops (a killed test run) does not outlive
the session.

Files: the jars in ``$FAILSLOW_KAFKA_LIBS`` or ``${XDG_CACHE_HOME:-~/.cache}/failslow/
kafka-3.9.1-libs`` (Maven's own cache is ~/.m2); the broker's configuration, data, log and
pid file in ``${FAILSLOW_STATE_DIR:-~/.cache/failslow}/kafka``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from failslow.infra.broker_config import (
    DEFAULT_HOST,
    LOG4J_PROPERTIES,
    NODE_ID,  # noqa: F401 - re-exported
    SCRAM_MECHANISM,
    SCRAM_USER,
    _cluster_id,
    _secure_files,
    _secure_setup,
    server_properties,
)
from failslow.settings import environment, get_settings

log = logging.getLogger(__name__)

KAFKA_VERSION = "3.9.1"
SCALA_VERSION = "2.13"
SLF4J_VERSION = "1.7.36"
#: What infra/kafka/pom.xml fetches (kept equal by a test); used when that file is not there
#: (an installed wheel has no infra/ folder).
MAVEN_ARTIFACTS: tuple[tuple[str, str, str], ...] = (
    ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
    ("org.slf4j", "slf4j-reload4j", SLF4J_VERSION),
)

ENV_BOOTSTRAP = "FAILSLOW_KAFKA"
ENV_STATE_DIR = "FAILSLOW_STATE_DIR"
ENV_LIBS = "FAILSLOW_KAFKA_LIBS"
DEFAULT_PORT = 9092
#: A broker started without ``--max-lifetime`` stops by itself after this many seconds.
DEFAULT_MAX_LIFETIME = 12 * 3600
DEFAULT_HEAP = "512m"

_REPO_POM = Path(__file__).resolve().parents[2] / "infra" / "kafka" / "pom.xml"
_COMPLETE = ".complete"


class InfraError(RuntimeError):
    """A local server could not be fetched, started or stopped; the message says why (and
    carries the tail of the server's log when it failed to start)."""


@dataclass(frozen=True)
class BrokerStatus:
    """What ``failslow infra status`` reports about the broker of one state directory."""

    running: bool
    state_dir: str
    log_file: str
    pid: int | None = None
    port: int | None = None
    controller_port: int | None = None
    started_at: float | None = None  # Unix seconds
    stops_at: float | None = None  # Unix seconds; None: no lifetime limit
    ready: bool | None = None  # an API call answered (None: not probed)
    #: ``port`` is a SASL_SSL listener (``infra up --secure``); the broker's own plain
    #: listener on 127.0.0.1 is then ``internal_port``
    secure: bool = False
    internal_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{DEFAULT_HOST}:{self.port if self.port is not None else DEFAULT_PORT}"

    def client_settings(self) -> dict[str, str]:
        """The variables a client needs for this broker (``KEY=value`` lines of ``infra
        up``): the password only by its file."""
        out = {ENV_BOOTSTRAP: self.bootstrap}
        if self.secure:
            sec = _secure_files(Path(self.state_dir))
            out.update({
                "FAILSLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "FAILSLOW_KAFKA_SASL_MECHANISM": SCRAM_MECHANISM,
                "FAILSLOW_KAFKA_SASL_USERNAME": SCRAM_USER,
                "FAILSLOW_KAFKA_SASL_PASSWORD_FILE": str(sec["password"]),
                "FAILSLOW_KAFKA_SSL_CAFILE": str(sec["ca"]),
            })
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bootstrap": self.bootstrap if self.running else None}

    def describe(self) -> str:
        if not self.running:
            return f"kafka: not running (state dir {self.state_dir})"
        text = f"kafka: running, pid {self.pid}, on {self.bootstrap}"
        if self.secure:
            text += " (SASL_SSL)"
        if self.ready is not None:
            text += " (answering)" if self.ready else " (not answering yet)"
        if self.stops_at is not None:
            left = max(0.0, self.stops_at - time.time())
            when = time.strftime("%H:%M:%S", time.localtime(self.stops_at))
            text += f"; stops by itself at {when} (in {left / 60:.0f} min)"
        return f"{text}\n  state dir {self.state_dir}\n  log {self.log_file}"


# ---------------------------------------------------------------------------------------------
# locations


def state_root() -> Path:
    """``$FAILSLOW_STATE_DIR`` (``infra.state_dir``) or ``~/.cache/failslow``."""
    configured = get_settings().infra.state_dir
    return configured.expanduser() if configured else Path.home() / ".cache" / "failslow"


def kafka_state_dir(state_dir: str | Path | None = None) -> Path:
    """The broker's folder: ``state_dir`` itself when given, else ``state_root()/kafka``."""
    return Path(state_dir).expanduser().resolve() if state_dir else state_root() / "kafka"


def lib_dir() -> Path:
    """Where the broker's jars are (``$FAILSLOW_KAFKA_LIBS`` or a folder in the user cache)."""
    configured = get_settings().infra.kafka_libs
    if configured:
        return configured.expanduser()
    cache = environment().get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "failslow" / f"kafka-{KAFKA_VERSION}-libs"


def _parse_bootstrap(value: str) -> tuple[str, int] | None:
    first = value.split(",")[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    host, sep, port = first.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host, int(port)


def _default_port() -> int:
    """The port of ``$FAILSLOW_KAFKA`` when it names this machine, else 9092."""
    parsed = _parse_bootstrap(get_settings().kafka.bootstrap or "")
    if parsed and parsed[0] in (DEFAULT_HOST, "localhost"):
        return parsed[1]
    return DEFAULT_PORT


def bootstrap_servers() -> str:
    """The Kafka bootstrap servers to use: ``$FAILSLOW_KAFKA``, else the broker that
    ``failslow infra up`` started (its port), else ``127.0.0.1:9092``."""
    configured = get_settings().kafka.bootstrap
    if configured:
        return configured
    status = kafka_status()
    if status.running:
        return status.bootstrap
    return f"{DEFAULT_HOST}:{DEFAULT_PORT}"


# ---------------------------------------------------------------------------------------------
# jars


def render_pom() -> str:
    """A pom equivalent to infra/kafka/pom.xml, for installs without the source tree."""
    deps = "".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>\n" for g, a, v in MAVEN_ARTIFACTS)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
            "  <modelVersion>4.0.0</modelVersion>\n"
            "  <groupId>io.failslow.infra</groupId><artifactId>failslow-kafka-broker</artifactId>"
            "<version>1</version><packaging>pom</packaging>\n"
            f"  <dependencies>\n{deps}  </dependencies>\n</project>\n")


def fetch_kafka_jars(libs: Path | None = None, *, quiet: bool = True,
                     timeout: float = 900.0) -> Path:
    """Copy the broker's jars (and their dependencies) from Maven Central into ``libs``
    (default :func:`lib_dir`) unless they are there; returns the folder.

    Runs ``mvn dependency:copy-dependencies`` on infra/kafka/pom.xml into a temporary folder
    and renames it into place, so an interrupted fetch never leaves a half-filled folder.
    """
    libs = libs or lib_dir()
    configured = get_settings().infra.kafka_libs is not None
    if (libs / _COMPLETE).exists() or (configured and any(libs.glob("kafka_*.jar"))):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise InfraError("Maven (mvn) is not installed: install it (Debian: apt-get install "
                         f"maven), or point {ENV_LIBS} at a Kafka {KAFKA_VERSION} libs/ folder")
    libs.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=libs.parent, prefix=".fetch-") as tmp:
        pom = _REPO_POM
        if not pom.exists():
            pom = Path(tmp) / "pom.xml"
            pom.write_text(render_pom())
        out = Path(tmp) / "libs"
        cmd = [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies",
               f"-DoutputDirectory={out}", "-DincludeScope=runtime"]
        if quiet:
            cmd.insert(1, "-q")
        log.info("fetching Kafka %s jars with Maven into %s", KAFKA_VERSION, libs)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  cwd=tmp, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise InfraError(f"Maven did not fetch the Kafka jars within {timeout:.0f} s") from None
        if proc.returncode != 0 or not any(out.glob(f"kafka_{SCALA_VERSION}-*.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise InfraError(f"Maven could not fetch the Kafka jars (exit {proc.returncode}):\n"
                             f"{tail}")
        (out / _COMPLETE).write_text("\n".join(sorted(p.name for p in out.glob("*.jar"))) + "\n")
        if libs.exists():  # a concurrent fetch won, or a stale incomplete folder
            if (libs / _COMPLETE).exists():
                return libs
            shutil.rmtree(libs)
        out.rename(libs)
    return libs


# ---------------------------------------------------------------------------------------------
# processes

#: Brokers started by this process: pid -> Popen (so their exit is reaped, not left a zombie).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and is the broker whose command line mentions ``marker``."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    proc = Path(f"/proc/{pid}")
    if proc.exists():
        try:
            stat = (proc / "stat").read_text()
            if stat[stat.rindex(")") + 2] in "ZX":
                return False
            return marker in (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((DEFAULT_HOST, 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((DEFAULT_HOST, port))
        except OSError:
            return False
    return True


def _tcp_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((DEFAULT_HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def _quiet_kafka_logs() -> Iterator[None]:
    logger = logging.getLogger("kafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def probe(bootstrap: str, timeout: float = 5.0) -> bool:
    """Whether a Kafka broker at ``bootstrap`` answers a metadata request within ``timeout``
    seconds and lists itself as a live broker."""
    parsed = _parse_bootstrap(bootstrap)
    if parsed is None:
        return False
    try:
        with socket.create_connection(parsed, timeout=min(timeout, 1.0)):
            pass
    except OSError:
        return False
    try:
        from kafka import KafkaAdminClient
    except ImportError as e:  # pragma: no cover - the kafka extra is part of [all]
        raise InfraError("kafka-python is not installed: pip install 'failslow[kafka]'") from e
    ms = max(1000, int(timeout * 1000))
    with _quiet_kafka_logs():
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="failslow-probe",
                                     request_timeout_ms=ms, bootstrap_timeout_ms=ms)
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            return False
        try:
            admin.list_topics()
            return bool(admin.describe_cluster().get("brokers"))
        except Exception:  # noqa: BLE001
            return False
        finally:
            with contextlib.suppress(Exception):
                admin.close()


def _files(sd: Path) -> dict[str, Path]:
    return {"props": sd / "server.properties", "log4j": sd / "log4j.properties",
            "data": sd / "data", "log": sd / "broker.log", "state": sd / "broker.json",
            "pid": sd / "broker.pid", "cluster": sd / "cluster.id"}


def _read_state(sd: Path) -> dict[str, Any]:
    try:
        data = json.loads(_files(sd)["state"].read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def kafka_status(state_dir: str | Path | None = None, *, check: bool = False,
                 timeout: float = 5.0) -> BrokerStatus:
    """Whether the broker of ``state_dir`` runs; with ``check`` also whether it answers."""
    sd = kafka_state_dir(state_dir)
    f = _files(sd)
    state = _read_state(sd)
    pid = state.get("pid")
    running = isinstance(pid, int) and _alive(pid, str(f["props"]))
    if not running:
        return BrokerStatus(False, str(sd), str(f["log"]))
    port = int(state["port"])
    internal = state.get("internal_port")
    ready = probe(f"{DEFAULT_HOST}:{internal or port}", timeout) if check else None
    return BrokerStatus(True, str(sd), str(f["log"]), pid=pid, port=port,
                        controller_port=state.get("controller_port"),
                        started_at=state.get("started_at"), stops_at=state.get("stops_at"),
                        ready=ready, secure=bool(state.get("secure")),
                        internal_port=internal)


def kafka_up(port: int | None = None, *, controller_port: int | None = None,
             state_dir: str | Path | None = None,
             max_lifetime: float | None = DEFAULT_MAX_LIFETIME, timeout: float = 120.0,
             heap: str = DEFAULT_HEAP, java: str | None = None,
             secure: bool = False) -> BrokerStatus:
    """Start the broker of ``state_dir`` in the background and wait until it answers.

    ``port`` 0 picks a free port (``None``: the port of ``$FAILSLOW_KAFKA`` if it names this
    machine, else 9092); ``controller_port`` defaults to a free port. The broker stops by
    itself after ``max_lifetime`` seconds (``None`` or 0: never). Idempotent: a running broker
    on the requested port is left as it is. Raises :class:`InfraError` with the tail of the
    broker's log if it does not answer within ``timeout`` seconds.

    ``secure``: ``port`` is a SASL_SSL listener (SCRAM-SHA-256/512 credentials of user
    :data:`SCRAM_USER` created when the storage is formatted, a CA and a server certificate
    made on the spot in ``STATE_DIR/tls``); the broker talks to itself on a plain listener
    on another port of 127.0.0.1. :meth:`BrokerStatus.client_settings` says how to connect.
    """
    sd = kafka_state_dir(state_dir)
    f = _files(sd)
    current = kafka_status(sd)
    if current.running:
        if current.secure != secure:
            raise InfraError(f"a {'secure' if current.secure else 'plain'} broker of {sd} "
                             f"already runs on port {current.port}; stop it first "
                             "(failslow infra down)")
        if port in (None, 0, current.port):
            return kafka_status(sd, check=True)
        raise InfraError(f"a broker of {sd} already runs on port {current.port}; "
                         "stop it first (failslow infra down)")
    port = _default_port() if port is None else port
    port = _free_port() if port == 0 else port
    if not _port_free(port):
        raise InfraError(f"port {port} on {DEFAULT_HOST} is in use (another Kafka?); "
                         "choose one with --port, or --port 0 for any free port")
    if controller_port is None or controller_port == 0:
        controller_port = _free_port()
        while controller_port == port:
            controller_port = _free_port()
    elif not _port_free(controller_port):
        raise InfraError(f"controller port {controller_port} on {DEFAULT_HOST} is in use")
    java = java or _java()
    libs = fetch_kafka_jars()
    sd.mkdir(parents=True, exist_ok=True)
    internal_port = None
    scram: str | None = None
    if secure:
        sec = _secure_setup(sd)
        internal_port = _free_port()
        while internal_port in (port, controller_port):
            internal_port = _free_port()
        fd = os.open(f["props"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            scram = sec["password"].read_text().strip()
            out.write(server_properties(internal_port, controller_port, f["data"],
                                        secure_port=port, keystore=sec["keystore"],
                                        truststore=sec["ca"], plain_password=scram))
    else:
        f["props"].write_text(server_properties(port, controller_port, f["data"]))
    f["log4j"].write_text(LOG4J_PROPERTIES)
    base = [java, "-cp", str(libs / "*"), f"-Dlog4j.configuration=file:{f['log4j']}",
            "-Djava.awt.headless=true", "-Djava.net.preferIPv4Stack=true"]
    _format_storage(base, f, scram)

    cmd = [*base[:1], f"-Xmx{heap}", "-Xms64m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
           f"-Dkafka.logs.dir={sd}", *base[1:], "kafka.Kafka", str(f["props"])]
    stops_at: float | None = None
    if max_lifetime:
        timeout_cmd = shutil.which("timeout")
        if timeout_cmd is None:
            raise InfraError("coreutils 'timeout' is missing; install it or pass "
                             "--max-lifetime 0 (the broker then runs until 'down')")
        cmd = [timeout_cmd, "--signal=TERM", "--kill-after=30", f"{int(max_lifetime)}s", *cmd]
        stops_at = time.time() + int(max_lifetime)
    env = {k: v for k, v in environment().items() if k not in ("CLASSPATH", "JAVA_TOOL_OPTIONS")}
    with f["log"].open("ab") as logf:
        logf.write(f"=== failslow infra up {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                   f"{' '.join(cmd)}\n".encode())
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=sd, env=env,
                                start_new_session=True)
    _CHILDREN[proc.pid] = proc
    started = time.time()
    f["pid"].write_text(f"{proc.pid}\n")
    f["state"].write_text(json.dumps({
        "pid": proc.pid, "port": port, "controller_port": controller_port,
        "started_at": started, "stops_at": stops_at, "version": KAFKA_VERSION,
        "secure": secure, "internal_port": internal_port}) + "\n")

    deadline = time.monotonic() + timeout
    bootstrap = f"{DEFAULT_HOST}:{internal_port or port}"
    while True:
        if proc.poll() is not None:
            _CHILDREN.pop(proc.pid, None)
            raise InfraError(f"the Kafka broker exited with status {proc.returncode} before it "
                             f"was ready; last lines of {f['log']}:\n{log_tail(f['log'])}")
        if _tcp_open(port) and _tcp_open(internal_port or port) \
                and probe(bootstrap, timeout=5.0):
            break
        if time.monotonic() > deadline:
            _stop(proc.pid, str(f["props"]), 15.0)
            raise InfraError(f"the Kafka broker did not answer on {bootstrap} within "
                             f"{timeout:.0f} s; last lines of {f['log']}:\n{log_tail(f['log'])}")
        time.sleep(0.25)
    log.info("kafka ready on %s after %.1f s", bootstrap, time.time() - started)
    return kafka_status(sd, check=False)


def _java() -> str:
    home = environment().get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise InfraError("Java is not installed: Kafka needs a Java 11+ runtime "
                         "(Debian: apt-get install default-jre-headless), or set JAVA_HOME")
    return found


def _format_storage(base: list[str], f: dict[str, Path], scram: str | None = None) -> None:
    """Format the KRaft log directory once (``kafka.tools.StorageTool format``); with
    ``scram`` (a password) also create the SCRAM credentials of :data:`SCRAM_USER`."""
    marker = f["data"] / ".scram"
    if (f["data"] / "meta.properties").exists():
        if scram is not None and not marker.exists():
            raise InfraError(f"{f['data']} was formatted without SCRAM credentials; start "
                             "the secure broker with another --state-dir")
        return
    cluster = f["cluster"].read_text().strip() if f["cluster"].exists() else ""
    cluster = cluster if cluster and not cluster.startswith("-") else _cluster_id()
    f["cluster"].write_text(cluster + "\n")
    cmd = [*base, "-Xmx256m", "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}",
           f"--config={f['props']}"]
    if scram is not None:  # the tool reads the credentials from its command line
        cmd += [arg for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                for arg in ("--add-scram", f"{mech}=[name={SCRAM_USER},password={scram}]")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InfraError("formatting the Kafka storage did not finish within 120 s") from None
    if proc.returncode != 0:
        text = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        if scram is not None:
            text = text.replace(scram, "********")
        raise InfraError(f"formatting the Kafka storage failed (exit {proc.returncode}):\n"
                         + text)
    if scram is not None:
        marker.write_text(f"{SCRAM_USER}\n")


def _stop(pid: int, marker: str, timeout: float) -> None:
    """SIGTERM the broker's process group, wait up to ``timeout`` s, then SIGKILL."""
    if not _alive(pid, marker):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid, marker):
            break
        time.sleep(0.1)
    else:
        log.warning("kafka (pid %d) ignored SIGTERM for %.0f s; killing it", pid, timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while _alive(pid, marker) and time.monotonic() < end:
            time.sleep(0.1)
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)


def kafka_down(state_dir: str | Path | None = None, *, timeout: float = 30.0) -> bool:
    """Stop the broker of ``state_dir``; True if one was running. Its data stays."""
    sd = kafka_state_dir(state_dir)
    f = _files(sd)
    status = kafka_status(sd)
    if status.running and status.pid is not None:
        _stop(status.pid, str(f["props"]), timeout)
    for name in ("pid", "state"):
        f[name].unlink(missing_ok=True)
    return status.running

