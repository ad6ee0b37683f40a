"""failslow's one settings object: the only module that reads the process environment.

Every setting has one environment variable (the table :data:`ENV`, all ``FAILSLOW_*`` but the
Grafana credentials that compose already names), may come from a config file
(``FAILSLOW_CONFIG`` = a TOML or YAML file with the same nested keys, e.g. ``[kafka]
bootstrap = "..."``) and is overridden by command-line flags. Precedence, highest first:
flags, environment, config file, defaults. A secret (``SecretStr``) may instead be read from
a file named by the same variable with ``_FILE`` appended (``FAILSLOW_CLICKHOUSE_PASSWORD_FILE``),
the way container secrets are mounted; it is never printed (``failslow config show`` masks it).

Code outside this module never reads ``os.environ``: it calls :func:`get_settings` for
settings and :func:`environment` for the raw variables a child process or a config template
(``${VAR}`` in a notify routes file) needs.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class KafkaSettings(BaseModel):
    """The Kafka cluster the stream commands use."""

    #: ``host:port[,host:port]``; None: the local broker of ``failslow infra up``
    bootstrap: str | None = None
    #: prefix of every topic name (several pipelines on one cluster)
    topic_prefix: str = ""
    #: consumer group of ``failslow process``
    group: str = "failslow-processor"
    #: partitions of the topics the processor creates
    partitions: int = 4
    #: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    #: ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512`` (with a ``SASL_*`` protocol)
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    sasl_username: str | None = None
    #: from ``FAILSLOW_KAFKA_SASL_PASSWORD_FILE`` (a mounted secret) or the variable itself
    sasl_password: SecretStr | None = None
    #: PEM file of the CA(s) that signed the brokers' certificates (None: the system's)
    ssl_cafile: Path | None = None
    #: client certificate (PEM) and its key, when the brokers ask for one (mutual TLS)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    #: check that a broker's certificate names the host connected to
    ssl_check_hostname: bool = True
    #: codec of the Arrow IPC record batches the producers publish: ``zstd`` (about 6x
    #: smaller than plain IPC), ``lz4`` (about 3.5x, decoded about 3x faster: less CPU per
    #: row in every consumer group) or ``none``; consumers read any of them
    ipc_compression: Literal["zstd", "lz4", "none"] = "zstd"

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def client_config(self) -> dict[str, Any]:
        """The kafka-python keyword arguments of the security settings (every client:
        producer, consumer, admin). Raises ValueError naming the variable that is missing."""
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_sasl:
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError(f"Kafka {self.security_protocol} needs "
                                 "FAILSLOW_KAFKA_SASL_USERNAME and "
                                 "FAILSLOW_KAFKA_SASL_PASSWORD_FILE (or the password variable)")
            out.update(sasl_mechanism=self.sasl_mechanism,
                       sasl_plain_username=self.sasl_username,
                       sasl_plain_password=self.sasl_password.get_secret_value())
        if self.uses_tls:
            for var, path in (("FAILSLOW_KAFKA_SSL_CAFILE", self.ssl_cafile),
                              ("FAILSLOW_KAFKA_SSL_CERTFILE", self.ssl_certfile),
                              ("FAILSLOW_KAFKA_SSL_KEYFILE", self.ssl_keyfile)):
                if path is not None and not Path(path).expanduser().is_file():
                    raise ValueError(f"{var}: no such file {path}")
            if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
                raise ValueError("a Kafka client certificate needs both "
                                 "FAILSLOW_KAFKA_SSL_CERTFILE and FAILSLOW_KAFKA_SSL_KEYFILE")
            out["ssl_check_hostname"] = self.ssl_check_hostname
            if self.ssl_cafile is not None:
                out["ssl_cafile"] = str(Path(self.ssl_cafile).expanduser())
            if self.ssl_certfile is not None and self.ssl_keyfile is not None:
                out["ssl_certfile"] = str(Path(self.ssl_certfile).expanduser())
                out["ssl_keyfile"] = str(Path(self.ssl_keyfile).expanduser())
                if self.ssl_key_password is not None:
                    out["ssl_password"] = self.ssl_key_password.get_secret_value()
        return out


class ClickHouseSettings(BaseModel):
    """The ClickHouse store: a server URL, else the embedded chDB in ``DATA_DIR/clickhouse``."""

    url: str | None = None
    database: str = "failslow"
    user: str | None = None
    password: SecretStr | None = None
    #: PEM file of the CA that signed an ``https://`` server's certificate (None: the system's)
    ca_file: Path | None = None
    #: check an ``https://`` server's certificate (turn off only for a test server)
    verify: bool = True


class ProcessorSettings(BaseModel):
    """``failslow process``: the stream processor."""

    #: checkpoints, the embedded store and other state (None: ``$XDG_DATA_HOME/failslow``)
    data_dir: Path | None = None
    #: Prometheus metrics port (0: any free port; None: no endpoint)
    metrics_port: int | None = 9464
    #: stop after this many idle seconds (None: run until stopped)
    exit_when_idle: float | None = None
    #: mitigation planner action costs, ``S2=5,S3=60,S4=1800`` (seconds of training)
    planner_costs: str = ""
    #: the registered detectors this processor runs, comma-separated (empty: all); one
    #: job's detection split over consumer groups, one group per set (issue 13)
    detectors: str = ""
    #: derived tables this processor exports for other consumer groups, and those it imports
    #: from them instead of deriving them (comma-separated; ``iterations``: the iteration
    #: tracker in a stage of its own, issue 13)
    exports: str = ""
    imports: str = ""
    #: ``I/N``: this processor reduces shard I of N of each job's evidence (the
    #: ``evidence`` detector, exported with ``--export evidence``; empty: none)
    shard: str = ""
    #: threads that run one job's independent detectors side by side (numpy releases the
    #: GIL in its sorts and reductions); 0: the cores the process may run on (its CPU
    #: affinity), at most 4; 1: none
    engine_threads: int = Field(default=0, ge=0)
    #: evidence reducers that share one job's ``coll`` rows in the slow-down detector
    #: (issue 13; the job meta must list its communicators), 1: one
    evidence_shards: int = Field(default=1, ge=1)
    #: the evidence reducer's hot loops: ``c`` (the compiled kernels the package builds
    #: when a C compiler is there, else numpy), ``numpy``, or the path of a kernel library
    evidence_kernel: str = "c"


class NotifySettings(BaseModel):
    """``failslow notify``: webhooks to the on-call engineer."""

    webhook_secret: SecretStr | None = None
    prometheus_url: str | None = None


class CollectorSettings(BaseModel):
    """The Python collectors and the node agent (the native collectors read the same
    variables in C, native/README.md)."""

    job: str = "default"
    ring_dir: Path = Path("/dev/shm")
    ring_capacity: int | None = None


class ProbeSettings(BaseModel):
    """Active validation probes (issue 17): run by the node agent on the job stage's request."""

    #: jobs whose anomalies may be probed, comma-separated (``*``: every job; empty: none)
    jobs: str = ""
    #: the agent's probe endpoint, ``host:port`` (peers send p2p / rtt probes to it)
    bind: str = "0.0.0.0:28090"
    #: the port of the other nodes' endpoints (the job stage names peers by node)
    port: int = 28090
    #: seconds a probe may take, waiting for its rank to leave a collective included
    deadline_s: float = 2.0
    #: probes started per minute on one node, and for one job (token buckets)
    node_per_minute: float = 6.0
    job_per_minute: float = 12.0
    #: payload of a p2p transfer, bytes
    p2p_bytes: int = 4 << 20

    def enabled_jobs(self) -> frozenset[str]:
        return frozenset(j.strip() for j in self.jobs.split(",") if j.strip())


class InfraSettings(BaseModel):
    """``failslow infra``: the local Kafka broker for development and tests."""

    #: broker configuration, data and logs (None: ``${XDG_CACHE_HOME:-~/.cache}/failslow``)
    state_dir: Path | None = None
    #: the broker's jars (None: under the cache directory)
    kafka_libs: Path | None = None


class GrafanaSettings(BaseModel):
    #: Grafana's base URL as people open it (links in pages and reports); empty: no links
    url: str = ""
    user: str = "admin"
    password: SecretStr = SecretStr("admin")


class BenchSettings(BaseModel):
    #: the TCPD change-point benchmark's data directory (``bench changepoints``)
    tcpd: Path | None = None


#: Environment variable -> setting (section, field). The one table of every variable.
ENV: dict[str, tuple[str, str]] = {
    "FAILSLOW_KAFKA": ("kafka", "bootstrap"),
    "FAILSLOW_TOPIC_PREFIX": ("kafka", "topic_prefix"),
    "FAILSLOW_GROUP": ("kafka", "group"),
    "FAILSLOW_PARTITIONS": ("kafka", "partitions"),
    "FAILSLOW_KAFKA_SECURITY_PROTOCOL": ("kafka", "security_protocol"),
    "FAILSLOW_KAFKA_SASL_MECHANISM": ("kafka", "sasl_mechanism"),
    "FAILSLOW_KAFKA_SASL_USERNAME": ("kafka", "sasl_username"),
    "FAILSLOW_KAFKA_SASL_PASSWORD": ("kafka", "sasl_password"),
    "FAILSLOW_KAFKA_SSL_CAFILE": ("kafka", "ssl_cafile"),
    "FAILSLOW_KAFKA_SSL_CERTFILE": ("kafka", "ssl_certfile"),
    "FAILSLOW_KAFKA_SSL_KEYFILE": ("kafka", "ssl_keyfile"),
    "FAILSLOW_KAFKA_SSL_KEY_PASSWORD": ("kafka", "ssl_key_password"),
    "FAILSLOW_KAFKA_SSL_CHECK_HOSTNAME": ("kafka", "ssl_check_hostname"),
    "FAILSLOW_KAFKA_COMPRESSION": ("kafka", "ipc_compression"),
    "FAILSLOW_CLICKHOUSE": ("clickhouse", "url"),
    "FAILSLOW_DATABASE": ("clickhouse", "database"),
    "FAILSLOW_CLICKHOUSE_USER": ("clickhouse", "user"),
    "FAILSLOW_CLICKHOUSE_PASSWORD": ("clickhouse", "password"),
    "FAILSLOW_CLICKHOUSE_CA": ("clickhouse", "ca_file"),
    "FAILSLOW_CLICKHOUSE_VERIFY": ("clickhouse", "verify"),
    "FAILSLOW_DATA_DIR": ("processor", "data_dir"),
    "FAILSLOW_METRICS_PORT": ("processor", "metrics_port"),
    "FAILSLOW_EXIT_WHEN_IDLE": ("processor", "exit_when_idle"),
    "FAILSLOW_PLANNER_COSTS": ("processor", "planner_costs"),
    "FAILSLOW_DETECTORS": ("processor", "detectors"),
    "FAILSLOW_EXPORT": ("processor", "exports"),
    "FAILSLOW_IMPORT": ("processor", "imports"),
    "FAILSLOW_SHARD": ("processor", "shard"),
    "FAILSLOW_ENGINE_THREADS": ("processor", "engine_threads"),
    "FAILSLOW_EVIDENCE_SHARDS": ("processor", "evidence_shards"),
    "FAILSLOW_EVIDENCE_KERNEL": ("processor", "evidence_kernel"),
    "FAILSLOW_WEBHOOK_SECRET": ("notify", "webhook_secret"),
    "FAILSLOW_PROMETHEUS_URL": ("notify", "prometheus_url"),
    "FAILSLOW_JOB": ("collector", "job"),
    "FAILSLOW_RING_DIR": ("collector", "ring_dir"),
    "FAILSLOW_RING_CAPACITY": ("collector", "ring_capacity"),
    "FAILSLOW_PROBE_JOBS": ("probes", "jobs"),
    "FAILSLOW_PROBE_BIND": ("probes", "bind"),
    "FAILSLOW_PROBE_PORT": ("probes", "port"),
    "FAILSLOW_PROBE_DEADLINE": ("probes", "deadline_s"),
    "FAILSLOW_PROBE_NODE_PER_MINUTE": ("probes", "node_per_minute"),
    "FAILSLOW_PROBE_JOB_PER_MINUTE": ("probes", "job_per_minute"),
    "FAILSLOW_PROBE_P2P_BYTES": ("probes", "p2p_bytes"),
    "FAILSLOW_STATE_DIR": ("infra", "state_dir"),
    "FAILSLOW_KAFKA_LIBS": ("infra", "kafka_libs"),
    "FAILSLOW_GRAFANA_URL": ("grafana", "url"),
    "GRAFANA_USER": ("grafana", "user"),
    "GRAFANA_ADMIN_PASSWORD": ("grafana", "password"),
    "FAILSLOW_TCPD": ("bench", "tcpd"),
    "FAILSLOW_LOG_FORMAT": ("", "log_format"),
}
#: Settings that are secrets: may come from ``<VARIABLE>_FILE``, never printed.
SECRETS = ("FAILSLOW_CLICKHOUSE_PASSWORD", "FAILSLOW_WEBHOOK_SECRET", "GRAFANA_ADMIN_PASSWORD",
           "FAILSLOW_KAFKA_SASL_PASSWORD", "FAILSLOW_KAFKA_SSL_KEY_PASSWORD")
CONFIG_ENV = "FAILSLOW_CONFIG"


def _nested(values: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (section, name), value in values.items():
        if section:
            out.setdefault(section, {})[name] = value
        else:
            out[name] = value
    return out


class _EnvTable(PydanticBaseSettingsSource):
    """The variables of :data:`ENV` (empty ones are unset) and the ``_FILE`` secrets."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything is in __call__

    def __call__(self) -> dict[str, Any]:
        env = environment()
        found: dict[tuple[str, str], Any] = {}
        for var, key in ENV.items():
            value = env.get(var, "")
            if var in SECRETS and not value and env.get(var + "_FILE"):
                path = Path(env[var + "_FILE"])
                try:
                    value = path.read_text().strip()
                except OSError as e:
                    raise ValueError(f"{var}_FILE: cannot read {path}: {e.strerror}") from None
            if value.strip():
                found[key] = value
        return _nested(found)


class _ConfigFile(PydanticBaseSettingsSource):
    """The file named by ``$FAILSLOW_CONFIG`` (or passed to :func:`load_settings`)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            text = self.path.read_text()
        except OSError as e:
            raise ValueError(f"config file {self.path}: {e.strerror}") from None
        try:
            data = (tomllib.loads(text) if self.path.suffix == ".toml"
                    else yaml.safe_load(text) or {})
        except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
            raise ValueError(f"config file {self.path}: not valid "
                             f"{'TOML' if self.path.suffix == '.toml' else 'YAML'}: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"config file {self.path}: expected a mapping of sections")
        return data


class Settings(BaseSettings):
    """Every setting of failslow (see the module docstring for where each comes from)."""

    model_config = SettingsConfigDict(extra="forbid")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    processor: ProcessorSettings = Field(default_factory=ProcessorSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    collector: CollectorSettings = Field(default_factory=CollectorSettings)
    infra: InfraSettings = Field(default_factory=InfraSettings)
    probes: ProbeSettings = Field(default_factory=ProbeSettings)
    grafana: GrafanaSettings = Field(default_factory=GrafanaSettings)
    bench: BenchSettings = Field(default_factory=BenchSettings)
    #: ``text`` (readable) or ``json`` (one object per line) logs on standard error
    log_format: Literal["text", "json"] = "text"

    @classmethod
    def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = _config_file or environment().get(CONFIG_ENV) or None
        return (init_settings, _EnvTable(settings_cls),
                _ConfigFile(settings_cls, Path(path) if path else None))

    def masked(self) -> dict[str, Any]:
        """The settings as plain JSON values, secrets shown as ``"********"``."""
        def plain(value: Any) -> Any:
            if isinstance(value, SecretStr):
                return "********"
            if isinstance(value, BaseModel):
                return {k: plain(getattr(value, k)) for k in type(value).model_fields}
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, str) and "://" in value:
                return redact_url(value)
            return value
        return {k: plain(getattr(self, k)) for k in type(self).model_fields}

    def show(self) -> str:
        """``failslow config show``: the effective settings, one ``section.key = value``
        per line with the variable that sets it."""
        var_of = {key: var for var, key in ENV.items()}
        lines = []
        for section, values in self.masked().items():
            items = values.items() if isinstance(values, dict) else [("", values)]
            for name, value in items:
                key = f"{section}.{name}" if name else section
                var = var_of.get((section, name) if name else ("", section), "")
                lines.append(f"{key:<28} {json.dumps(value):<32} {var}")
        return "\n".join(lines)


def redact_url(url: str) -> str:
    """``url`` with the password of its user part replaced by ``********``
    (``http://user:pw@host`` -> ``http://user:********@host``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, path = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:********@{host}{slash}{path}"


#: the config file given on the command line (``failslow --config FILE``)
_config_file: Path | None = None


def environment() -> dict[str, str]:
    """A copy of the process environment: for child processes and config templates."""
    return dict(os.environ)


def _inputs() -> tuple[object, ...]:
    """What the settings are read from: the config file and the variables of :data:`ENV`
    (with the ``_FILE`` twins of the secrets), so that a changed variable is seen."""
    env = os.environ
    names = (CONFIG_ENV, *ENV, *(var + "_FILE" for var in SECRETS))
    return (_config_file, *(env.get(name) for name in names))


@lru_cache(maxsize=1)
def _load(inputs: tuple[object, ...]) -> Settings:
    return Settings()


def get_settings() -> Settings:
    """The settings of this process: read once, and again when a variable of :data:`ENV` or
    the config file changes (:func:`reload_settings` also re-reads the files)."""
    return _load(_inputs())


def reload_settings() -> Settings:
    """Read the environment and config file again (tests; ``failslow --config FILE``)."""
    _load.cache_clear()
    return get_settings()


def set_config_file(path: str | Path) -> Settings:
    """Use ``path`` as the config file (``failslow --config FILE``) and read the settings."""
    global _config_file
    _config_file = Path(path)
    return reload_settings()
