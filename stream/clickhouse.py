"""ClickHouse storage: the DDL of the output contract (:data:`failslow.results.TABLES`), a
sink that writes Arrow tables with ``insert_arrow``, the processor's checkpoint store and the
reads behind ``failslow query``.

By default the database is embedded chDB in a local directory (no server to run); with a
URL the same code talks to a ClickHouse server. chDB runs one engine per process and one
process per directory: close the client (``ClickHouseSink.close()`` or ``client.close()``)
before opening another directory; a second process cannot open a directory in use (the
processor then waits and retries, as for a server that is down).

Tables (:func:`schema_sql` gives the DDL, :func:`write_schema` writes it, both in
:mod:`failslow.stream.clickhouse_ddl` with the schema versions;
infra/clickhouse/schema.sql is the committed copy):

- the event kinds (``meta``, ``coll``, ``progress``, ``link``, ``gpu``, ``span``), the derived
  ``rounds`` and ``iterations``, ``anomalies`` (one row per report), ``advice`` (one row per
  mitigation decision, Greyhound §5.1, keyed by its deterministic ``advice_id``), ``whatif`` and
  ``diagnoses`` (the rest of diagnosis.md's shape), and the processor's ``processor_cuts``
  and ``processor_snapshots`` (:mod:`failslow.stream.state`);
- large tables are partitioned by the UTC day of their event time and expire a fixed time
  after ingestion (``ingested_at``; event times of replayed traces may be years old);
  small ones (job descriptions, anomalies, diagnoses, what-if results) are kept;
- columns carry codecs for their shape: Delta+ZSTD for times and cumulative counters, T64
  for sizes and step counts, ZSTD for JSON text; enumerations and names are LowCardinality.

Idempotence: every table is a ReplacingMergeTree whose sorting key is the record's natural
key (an operation's ``(job, comm, seq, rank, phase)``, ...), with
``non_replicated_deduplication_window`` set; each write passes ``insert_deduplication_token``
derived from the input offsets it covers, so a batch written again (after a retry, or by a
restarted processor that re-cuts its input at the logged cuts) is dropped by ClickHouse
instead of duplicated. Rows that arrive twice by any other path collapse under ``FINAL``.

On a cluster (``cluster=``), each table is a ``Replicated...MergeTree`` named ``<table>_local``
created ``ON CLUSTER`` with ``replicated_deduplication_window``, and ``<table>`` is a
``Distributed`` table over it, sharded by the first sorting column (job, or consumer group)
so that rows that collapse meet on one shard; readers and writers use the same names.
Writes through a Distributed table keep their deduplication token when inserted
synchronously (``distributed_foreground_insert = 1``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from failslow import results
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.results import SPECS
from failslow.settings import environment, get_settings
from failslow.stream.clickhouse_ddl import (  # the DDL and schema versions, re-exported
    DEDUP_WINDOW,  # noqa: F401
    DEFAULT_DATABASE,
    SchemaError,  # noqa: F401
    clickhouse_type,  # noqa: F401
    codec_for,  # noqa: F401
    create_distributed_table,  # noqa: F401
    create_table,  # noqa: F401
    ddl,  # noqa: F401
    schema_sql,  # noqa: F401
    stored_schema,  # noqa: F401
    upgrade_schema,
    versioned_comment,  # noqa: F401
    write_schema,  # noqa: F401
)
from failslow.stream.sink import (
    Sink,
    SinkBackpressureError,
    SinkBatch,
    anomalies_from_table,
    select_schema,
)
from failslow.stream.state import Cut, PartitionSnapshot, StateStore, pack_text, unpack_text

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The tables of the event contract's record kinds other than ``meta`` (raw collector rows).
RAW_EVENT_TABLES = frozenset(t.name for t in results.EVENT_TABLES if t.name != "meta")
#: Tables of flat columns (no lists), which embedded chDB reads in place
#: (:func:`insert_in_process`).
IN_PROCESS_TABLES = frozenset(name for name, spec in SPECS.items()
                              if not any(pa.types.is_nested(f.type) for f in spec.schema))
#: Tables the processor's sink writes to.
DATA_TABLES = tuple(t.name for t in results.EVENT_TABLES + results.OUTPUT_TABLES)

# ---------------------------------------------------------------------------------------------
# connecting


def default_data_dir() -> Path:
    """``$FAILSLOW_DATA_DIR``, else ``$XDG_DATA_HOME/failslow``, else
    ``~/.local/share/failslow``."""
    configured = get_settings().processor.data_dir
    if configured is not None:
        return Path(configured).expanduser()
    base = environment().get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "failslow"


def server_options(url: str) -> dict[str, Any]:
    """The clickhouse-connect arguments of a server ``url`` with the settings: the user
    and the password (``FAILSLOW_CLICKHOUSE_USER``, ``FAILSLOW_CLICKHOUSE_PASSWORD`` or its
    ``_FILE``) unless the URL names them; for ``https://`` the CA file
    (``FAILSLOW_CLICKHOUSE_CA``) and certificate checks (``FAILSLOW_CLICKHOUSE_VERIFY``).
    Timeouts are short, so an unreachable server is reported within seconds."""
    ch = get_settings().clickhouse
    options: dict[str, Any] = {"dsn": url, "connect_timeout": 5, "send_receive_timeout": 60}
    scheme, _, rest = url.partition("://")
    netloc = rest.split("/", 1)[0]
    userinfo = netloc.rpartition("@")[0]
    if ch.user and not userinfo:
        options["username"] = ch.user
    if ch.password is not None and ":" not in userinfo:
        options["password"] = ch.password.get_secret_value()
    if scheme.lower() == "https":
        options["secure"] = True
        options["verify"] = ch.verify
        if ch.ca_file is not None:
            ca = Path(ch.ca_file).expanduser()
            if not ca.is_file():
                raise ValueError(f"FAILSLOW_CLICKHOUSE_CA: no such file {ca}")
            options["ca_cert"] = str(ca)
    return options


def describe_error(exc: BaseException, url: str | None) -> str:
    """One line about a failed ClickHouse request: the address and what went wrong,
    without the password."""
    from failslow.settings import redact_url

    where = f"ClickHouse at {redact_url(url)}" if url else "the embedded ClickHouse"
    text = str(exc)
    low = text.lower()
    if "certificate" in low or "ssl" in low:
        return f"{where}: TLS failed ({type(exc).__name__}); check FAILSLOW_CLICKHOUSE_CA"
    if "authentication failed" in low or "code: 516" in low or "code: 192" in low:
        return (f"{where}: authentication failed; check FAILSLOW_CLICKHOUSE_USER and "
                "FAILSLOW_CLICKHOUSE_PASSWORD_FILE")
    if "connection refused" in low or "max retries" in low or "timed out" in low \
            or "name or service not known" in low or "failed to establish" in low:
        return f"{where} is not reachable"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{where}: {type(exc).__name__}: {first[:200]}"


def connect(data_dir: str | Path | None = None, url: str | None = None) -> Any:
    """A clickhouse-connect client: a server when ``url`` is given (e.g.
    ``http://default:@127.0.0.1:8123``, user, password and TLS from the settings:
    :func:`server_options`), else embedded chDB storing in ``DATA_DIR/clickhouse``
    (default :func:`default_data_dir`)."""
    import clickhouse_connect

    if url:
        return clickhouse_connect.get_client(**server_options(url))
    path = Path(data_dir) if data_dir is not None else default_data_dir()
    (path / "clickhouse").mkdir(parents=True, exist_ok=True)
    return clickhouse_connect.get_client(interface="chdb", path=str(path / "clickhouse"))


#: ClickHouse error codes that mean "not now": overload, timeouts, network, read-only.
TRANSIENT_CODES = frozenset({3, 159, 164, 202, 203, 209, 210, 241, 242, 252, 279, 425, 999})
_CODE = re.compile(r"Code: (\d+)")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` from clickhouse-connect means the store is unreachable, overloaded or
    busy (retry later) rather than a request it will never accept."""
    from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

    if isinstance(exc, OperationalError | ConnectionError | TimeoutError | OSError):
        return True
    text = str(exc)
    if "Unable to open the chdb engine" in text:  # another process holds the directory
        return True
    if isinstance(exc, DatabaseError):
        m = _CODE.search(text)
        return bool(m and int(m.group(1)) in TRANSIENT_CODES)
    return False


def is_embedded(client: Any) -> bool:
    """Whether ``client`` is clickhouse-connect's in-process chDB client."""
    return type(client).__name__ == "ChdbClient"


def insert_in_process(client: Any, table: str, failslow_insert_block: pa.Table,
                      settings: dict[str, Any]) -> None:
    """Insert an Arrow table into embedded chDB where it lies in memory: chDB's ``Python()``
    table function finds it by its variable name in the calling frames. clickhouse-connect's
    ``insert_arrow`` writes an Arrow file into memory, copies it and writes it to a
    temporary file that chDB reads back. That was most of the storing stage's CPU (``failslow
    bench pipeline``, stage ``store``; docs/scaling.md).
    ``tests/integration/clickhouse/test_insert_paths.py`` checks that both paths store the
    same rows."""
    columns = ", ".join(f"`{c}`" for c in failslow_insert_block.column_names)
    client.command(f"INSERT INTO {table} ({columns}) SELECT {columns} "
                   "FROM Python(failslow_insert_block)", settings=settings or None)


class Store:
    """One ClickHouse database, connected on first use: ``client`` (already connected) or
    ``connect`` (called, and called again after a failure, until it works). The schema is
    created once connected (``create``). :meth:`run` maps "not now" failures to
    :class:`~failslow.stream.sink.SinkBackpressureError`, so callers retry later."""

    def __init__(self, client: Any = None, database: str = DEFAULT_DATABASE, *,
                 connect: Callable[[], Any] | None = None, create: bool = True,
                 retry_after: float = 1.0) -> None:
        if client is None and connect is None:
            raise ValueError("give a client or a connect function")
        self.database = database
        self._client = client
        self._connect = connect
        self._create = create
        self._created = False
        self.retry_after = retry_after
        if client is not None and create:
            self.create_schema()

    @property
    def client(self) -> Any:
        """The connected client (connects if needed; raises on failure)."""
        if self._client is None:
            assert self._connect is not None
            try:
                self._client = self._connect()
            except Exception as e:
                if is_transient(e):
                    raise SinkBackpressureError(self.retry_after,
                                                f"ClickHouse unavailable: {e}") from e
                raise
            log.info("connected to ClickHouse (database %s)", self.database)
        if self._create and not self._created:
            self.create_schema()
        return self._client

    def create_schema(self) -> None:
        """Create the tables, or upgrade an older schema (:func:`upgrade_schema`)."""
        upgrade_schema(self._client, self.database)
        self._created = True

    def run(self, fn: Callable[[Any], T]) -> T:
        """``fn(client)``; transient failures raise SinkBackpressureError."""
        client = self.client
        try:
            return fn(client)
        except SinkBackpressureError:
            raise
        except Exception as e:
            if is_transient(e):
                raise SinkBackpressureError(self.retry_after, f"ClickHouse: {e}") from e
            raise

    def insert(self, name: str, table: pa.Table, token: str | None = None) -> None:
        spec = SPECS.get(name)
        if spec is None:
            raise ValueError(f"no ClickHouse table for {name!r}")
        if not table.num_rows:
            return
        settings: dict[str, Any] = {}
        if token:
            settings["insert_deduplication_token"] = token
        if name in RAW_EVENT_TABLES:
            # raw events are not collapsed at insert time (merges and FINAL reads still do;
            # a replayed block is dropped by its token): ~40% less CPU per row on the
            # embedded store. Derived tables (anomalies, advice, ...) collapse at once, so
            # that plain reads see one row per report.
            settings["optimize_on_insert"] = 0
        data = select_schema(table, spec.schema)
        if name in IN_PROCESS_TABLES and is_embedded(self.client):
            self.run(lambda c: insert_in_process(c, f"`{self.database}`.`{name}`", data,
                                                 settings))
        else:
            self.run(lambda c: c.insert_arrow(f"`{self.database}`.`{name}`", data,
                                              settings=settings or None))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# ---------------------------------------------------------------------------------------------
# the sink


class ClickHouseSink(Sink):
    """Writes the processor's tables into ClickHouse (one ``insert_arrow`` per table per
    batch, with the batch's deduplication token) and reads them back. ``client`` is a
    connected client (the schema is created at once unless ``create=False``), or pass
    ``connect`` to connect on the first write and retry while the store is unavailable."""

    def __init__(self, client: Any = None, database: str = DEFAULT_DATABASE,
                 create: bool = True, *, connect: Callable[[], Any] | None = None,
                 store: Store | None = None) -> None:
        self.store = store or Store(client, database, connect=connect, create=create)
        self.database = self.store.database

    @property
    def client(self) -> Any:
        return self.store.client

    def create_schema(self) -> None:
        _ = self.store.client
        self.store.create_schema()

    def drop(self) -> None:
        """Drop the database (demo re-runs)."""
        self.store.run(lambda c: c.command(f"DROP DATABASE IF EXISTS `{self.database}`"))
        self.store._created = False

    def write(self, batch: SinkBatch) -> None:
        for name in batch.tables:
            if name not in SPECS:
                raise ValueError(f"no ClickHouse table for {name!r}")
        for name, table in batch.tables.items():
            self.store.insert(name, table, f"{batch.token}/{name}" if batch.token else None)

    def close(self) -> None:
        self.store.close()

    # reading back

    def read(self, name: str, job: str | None = None, final: bool = True) -> pa.Table:
        """All rows of table ``name`` (of one job), with the contract's Arrow schema."""
        spec = SPECS[name]
        cols = ", ".join(f"`{c}`" for c in spec.schema.names)
        fin = " FINAL" if final and "Replacing" in spec.engine else ""
        where = " WHERE job = {job:String}" if job is not None else ""
        order = f" ORDER BY {', '.join(spec.order_by)}"
        result = self.store.run(lambda c: c.query_arrow(
            f"SELECT {cols} FROM `{self.database}`.`{name}`{fin}{where}{order}",
            parameters={"job": job} if job is not None else None))
        return select_schema(_plain_strings(result), spec.schema)

    def anomalies(self, job: str | None = None) -> list[tuple[str, Anomaly]]:
        """The latest report of every anomaly, ordered by job and start time."""
        rows = anomalies_from_table(self.read("anomalies", job))
        return sorted(rows, key=lambda ja: (ja[0], ja[1].start_ns or 0, ja[1].id))

    def count(self, name: str, job: str | None = None, final: bool = False) -> int:
        """Rows of ``name`` (of one job); ``final`` counts rows after collapsing duplicates."""
        where = " WHERE job = {job:String}" if job is not None else ""
        fin = " FINAL" if final and "Replacing" in SPECS[name].engine else ""
        rows = self.store.run(lambda c: c.query(
            f"SELECT count() FROM `{self.database}`.`{name}`{fin}{where}",
            parameters={"job": job} if job is not None else None).result_rows)
        return int(rows[0][0])

    def jobs(self) -> list[str]:
        """Jobs with a description (``meta``) or anomalies in the store."""
        rows = self.store.run(lambda c: c.query(
            f"SELECT DISTINCT job FROM (SELECT job FROM `{self.database}`.`meta` UNION ALL "
            f"SELECT job FROM `{self.database}`.`anomalies`) ORDER BY job").result_rows)
        return [str(r[0]) for r in rows]

    def diagnosis(self, job: str) -> Diagnosis:
        """What the store holds for ``job`` in diagnosis.md's shape: the latest report of
        every anomaly, the latest iterations summary and the latest what-if result."""
        anomalies = [a for _, a in self.anomalies(job)]
        summary = results.from_table("diagnoses", self.read("diagnoses", job))
        iterations = summary[-1]["iterations"] if summary else None
        if iterations is None:
            iterations = self._iterations_from_rows(job)
        whatif_rows = results.from_table("whatif", self.read("whatif", job))
        whatif = whatif_rows[-1]["result"] if whatif_rows else None
        return Diagnosis(job=job, iterations=iterations or None, anomalies=anomalies,
                         whatif=whatif)

    def _iterations_from_rows(self, job: str) -> dict[str, Any] | None:
        rows = self.store.run(lambda c: c.query(
            f"SELECT count(), median(duration_ns) FROM `{self.database}`.`iterations` FINAL "
            "WHERE job = {job:String} AND rank = -1", parameters={"job": job}).result_rows)
        count, median = rows[0]
        if not count:
            return None
        return {"period_ops": None, "median_s": round(float(median) / 1e9, 6),
                "count": int(count)}


def _plain_strings(table: pa.Table) -> pa.Table:
    """Dictionary-encoded (LowCardinality) and large string columns as plain strings."""
    cols = []
    for col in table.columns:
        typ = col.type
        if pa.types.is_dictionary(typ):
            col = col.cast(typ.value_type)
            typ = col.type
        if pa.types.is_large_string(typ) or pa.types.is_binary(typ) \
                or pa.types.is_large_binary(typ):
            col = col.cast(pa.string())
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


# ---------------------------------------------------------------------------------------------
# the processor's checkpoints


class ClickHouseStateStore(StateStore):
    """Cuts and snapshots (:mod:`failslow.stream.state`) in the tables ``processor_cuts``
    and ``processor_snapshots`` of the sink's database, so a processor keeps no local state
    (a container can be replaced) and its checkpoints live as long as the data."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _table(self, name: str) -> str:
        return f"`{self.store.database}`.`{name}`"

    def load(self, group: str, partition: int) -> tuple[PartitionSnapshot | None, list[Cut]]:
        params = {"g": group, "p": int(partition)}
        snaps = self.store.run(lambda c: c.query(
            f"SELECT seq, offsets, state, created_ns FROM {self._table('processor_snapshots')}"
            " WHERE consumer_group = {g:String} AND partition_id = {p:UInt32}"
            " ORDER BY created_ns DESC LIMIT 1", parameters=params).result_rows)
        snap = None
        after = -1
        if snaps:
            seq, offsets, state, created = snaps[0]
            snap = PartitionSnapshot(int(partition), int(seq),
                                     {str(k): int(v) for k, v in json.loads(offsets).items()},
                                     unpack_text(state), int(created))
            after = int(seq)
        rows = self.store.run(lambda c: c.query(
            f"SELECT DISTINCT seq, ranges, created_ns FROM {self._table('processor_cuts')}"
            " WHERE consumer_group = {g:String} AND partition_id = {p:UInt32} AND seq > {s:Int64}"
            " ORDER BY seq", parameters={**params, "s": after}).result_rows)
        cuts = [Cut(int(partition), int(seq),
                    {str(t): (int(r[0]), int(r[1])) for t, r in json.loads(ranges).items()},
                    int(created)) for seq, ranges, created in rows]
        return snap, cuts

    def log_cuts(self, group: str, cuts: Iterable[Cut]) -> None:
        rows = [{"consumer_group": group, "partition_id": c.partition, "seq": c.seq,
                 "ranges": {t: list(r) for t, r in c.ranges.items()},
                 "created_ns": c.created_ns or time.time_ns()} for c in cuts]
        if rows:
            self.store.insert("processor_cuts", results.to_table("processor_cuts", rows))

    def save_snapshots(self, group: str, snapshots: Iterable[PartitionSnapshot]) -> None:
        rows = [{"consumer_group": group, "partition_id": s.partition, "seq": s.seq,
                 "offsets": dict(s.offsets), "state": pack_text(s.state),
                 "created_ns": s.created_ns or time.time_ns()} for s in snapshots]
        if rows:
            self.store.insert("processor_snapshots", results.to_table("processor_snapshots", rows))

