-- failslow ClickHouse schema (event contract v2).
-- Generated from failslow.results by `failslow schema FILE`;
-- do not edit by hand.

CREATE DATABASE IF NOT EXISTS `failslow`;

CREATE TABLE IF NOT EXISTS `failslow`.`meta`
(
    `job`          LowCardinality(String),
    `t`            Int64 CODEC(Delta, ZSTD(1)),
    `world_size`   Int32,
    `tp`           Int32,
    `pp`           Int32,
    `dp`           Int32,
    `cp`           Int32,
    `microbatches` Int32,
    `schedule`     LowCardinality(String),
    `nodes`        String CODEC(ZSTD(3)),
    `comms`        String CODEC(ZSTD(3)),
    `time`         DateTime64(9) ALIAS fromUnixTimestamp64Nano(t),
    `ingested_at`  DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree(t)
ORDER BY (job)
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'job descriptions; the row with the largest t wins [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`coll`
(
    `job`         LowCardinality(String),
    `rank`        Int32 CODEC(T64, ZSTD(1)),
    `comm`        UInt64,
    `comm_rank`   Int32 CODEC(T64, ZSTD(1)),
    `comm_size`   Int32 CODEC(T64, ZSTD(1)),
    `seq`         UInt64 CODEC(Delta, ZSTD(1)),
    `op`          LowCardinality(String),
    `bytes`       UInt64 CODEC(T64, ZSTD(1)),
    `peer`        Int32,
    `phase`       LowCardinality(String),
    `t`           Int64 CODEC(Delta, ZSTD(1)),
    `t_start`     Nullable(Int64) CODEC(Delta, ZSTD(1)),
    `send_count`  Nullable(UInt64) CODEC(T64, ZSTD(1)),
    `recv_count`  Nullable(UInt64) CODEC(T64, ZSTD(1)),
    `time`        DateTime64(9) ALIAS fromUnixTimestamp64Nano(t),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t), 'UTC')
ORDER BY (job, comm, seq, rank, phase)
TTL ingested_at + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'collective and point-to-point operations, enter and end rows [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`progress`
(
    `job`         LowCardinality(String),
    `rank`        Int32 CODEC(T64, ZSTD(1)),
    `comm`        UInt64,
    `seq`         UInt64 CODEC(Delta, ZSTD(1)),
    `t`           Int64 CODEC(Delta, ZSTD(1)),
    `send_count`  UInt64 CODEC(T64, ZSTD(1)),
    `recv_count`  UInt64 CODEC(T64, ZSTD(1)),
    `time`        DateTime64(9) ALIAS fromUnixTimestamp64Nano(t),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t), 'UTC')
ORDER BY (job, comm, seq, rank, t)
TTL ingested_at + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'in-flight progress samples [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`link`
(
    `job`         LowCardinality(String),
    `node`        LowCardinality(String),
    `rank`        Nullable(Int32) CODEC(T64, ZSTD(1)),
    `device`      LowCardinality(String),
    `peer_node`   LowCardinality(Nullable(String)),
    `t`           Int64 CODEC(Delta, ZSTD(1)),
    `posted`      UInt64 CODEC(Delta, ZSTD(1)),
    `completed`   UInt64 CODEC(Delta, ZSTD(1)),
    `bytes`       UInt64 CODEC(Delta, ZSTD(1)),
    `time`        DateTime64(9) ALIAS fromUnixTimestamp64Nano(t),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t), 'UTC')
ORDER BY (job, node, device, peer_node, rank, t)
TTL ingested_at + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000, allow_nullable_key = 1
COMMENT 'RDMA work-request counters [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`gpu`
(
    `job`              LowCardinality(String),
    `node`             LowCardinality(String),
    `rank`             Nullable(Int32) CODEC(T64, ZSTD(1)),
    `gpu`              Int32 CODEC(T64, ZSTD(1)),
    `t`                Int64 CODEC(Delta, ZSTD(1)),
    `sm_clock_mhz`     Int32,
    `mem_clock_mhz`    Int32,
    `temp_c`           Int32,
    `power_w`          Float64 CODEC(ZSTD(1)),
    `util_pct`         Int32,
    `throttle_reasons` UInt64,
    `time`             DateTime64(9) ALIAS fromUnixTimestamp64Nano(t),
    `ingested_at`      DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t), 'UTC')
ORDER BY (job, node, gpu, t)
TTL ingested_at + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'device samples [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`span`
(
    `job`         LowCardinality(String),
    `rank`        Int32 CODEC(T64, ZSTD(1)),
    `step`        Int64 CODEC(Delta, ZSTD(1)),
    `microbatch`  Int32,
    `chunk`       Int32,
    `op`          LowCardinality(String),
    `t_start`     Int64 CODEC(Delta, ZSTD(1)),
    `t_end`       Int64 CODEC(Delta, ZSTD(1)),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t_start), 'UTC')
ORDER BY (job, rank, step, microbatch, chunk, op, t_start)
TTL ingested_at + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'framework spans [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`ras`
(
    `job`         LowCardinality(String),
    `t`           Int64 CODEC(Delta, ZSTD(1)),
    `node`        LowCardinality(String),
    `comm`        UInt64,
    `comm_size`   Int32 CODEC(T64, ZSTD(1)),
    `rank`        Int32 CODEC(T64, ZSTD(1)),
    `finding`     LowCardinality(String),
    `function`    LowCardinality(Nullable(String)),
    `count`       Nullable(UInt64),
    `expected`    Nullable(UInt64),
    `time`        DateTime64(9) ALIAS fromUnixTimestamp64Nano(t),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t), 'UTC')
ORDER BY (job, t, comm, rank, finding)
TTL ingested_at + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'NCCL RAS findings (contract v2) [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`probe`
(
    `job`         LowCardinality(String),
    `t`           Int64 CODEC(Delta, ZSTD(1)),
    `node`        LowCardinality(String),
    `request`     LowCardinality(String),
    `probe`       LowCardinality(String),
    `rank`        Int32 CODEC(T64, ZSTD(1)),
    `peer`        Nullable(Int32),
    `status`      LowCardinality(String),
    `duration_ns` Int64 CODEC(T64, ZSTD(1)),
    `elapsed_ns`  Nullable(Int64),
    `bytes`       Nullable(UInt64) CODEC(T64, ZSTD(1)),
    `baseline_ns` Nullable(Int64),
    `detail`      Nullable(String),
    `time`        DateTime64(9) ALIAS fromUnixTimestamp64Nano(t),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t), 'UTC')
ORDER BY (job, request, rank, t)
TTL ingested_at + INTERVAL 14 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'active validation probes and their outcome (contract v2) [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`rounds`
(
    `job`             LowCardinality(String),
    `comm`            UInt64,
    `seq`             UInt64 CODEC(Delta, ZSTD(1)),
    `op`              LowCardinality(String),
    `bytes`           UInt64 CODEC(T64, ZSTD(1)),
    `members`         Int32 CODEC(T64, ZSTD(1)),
    `t_first_enter`   Int64 CODEC(Delta, ZSTD(1)),
    `t_last_enter`    Int64 CODEC(Delta, ZSTD(1)),
    `t_end`           Int64 CODEC(Delta, ZSTD(1)),
    `last_rank`       Int32,
    `duration_max_ns` Int64 CODEC(T64, ZSTD(1)),
    `duration_min_ns` Int64 CODEC(T64, ZSTD(1)),
    `ingested_at`     DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t_first_enter), 'UTC')
ORDER BY (job, comm, seq, t_first_enter, last_rank)
TTL ingested_at + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'completed rounds (derived by the detectors) [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`iterations`
(
    `job`         LowCardinality(String),
    `rank`        Int32 CODEC(T64, ZSTD(1)),
    `iteration`   Int64 CODEC(Delta, ZSTD(1)),
    `t_start`     Int64 CODEC(Delta, ZSTD(1)),
    `t_end`       Int64 CODEC(Delta, ZSTD(1)),
    `duration_ns` Int64 CODEC(T64, ZSTD(1)),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(fromUnixTimestamp64Nano(t_start), 'UTC')
ORDER BY (job, rank, iteration)
TTL ingested_at + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'training iterations per rank, rank -1 = the job (derived) [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`anomalies`
(
    `job`         LowCardinality(String),
    `id`          String,
    `version`     UInt64 CODEC(Delta, ZSTD(1)),
    `kind`        LowCardinality(String),
    `cause`       LowCardinality(String),
    `ranks`       Array(Int32),
    `link`        Array(Int32),
    `comm`        Nullable(UInt64),
    `comm_kind`   LowCardinality(Nullable(String)),
    `stage`       LowCardinality(Nullable(String)),
    `start_ns`    Nullable(Int64) CODEC(Delta, ZSTD(1)),
    `detected_ns` Nullable(Int64) CODEC(Delta, ZSTD(1)),
    `end_ns`      Nullable(Int64) CODEC(Delta, ZSTD(1)),
    `slowdown`    Nullable(Float64) CODEC(ZSTD(1)),
    `R`           Nullable(Float64) CODEC(ZSTD(1)),
    `P`           Nullable(Float64) CODEC(ZSTD(1)),
    `extra`       String CODEC(ZSTD(3)),
    `reported_ns` Int64 CODEC(Delta, ZSTD(1)),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job, id)
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'one row per anomaly report; the largest version of (job, id) wins [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`advice`
(
    `version`         Int16 CODEC(Delta, ZSTD(1)),
    `advice_id`       String,
    `job`             LowCardinality(String),
    `anomaly_id`      String,
    `cause`           LowCardinality(String),
    `ranks`           Array(Nullable(Int64)),
    `link`            Array(Nullable(Int64)),
    `strategy`        LowCardinality(String),
    `action`          LowCardinality(String),
    `t_ns`            Int64 CODEC(Delta, ZSTD(1)),
    `impact_s`        Float64 CODEC(ZSTD(1)),
    `cost_s`          Float64 CODEC(ZSTD(1)),
    `slow_iterations` Int64,
    `t_slow_s`        Nullable(Float64) CODEC(ZSTD(1)),
    `t_healthy_s`     Nullable(Float64) CODEC(ZSTD(1)),
    `description`     LowCardinality(String),
    `reason`          String CODEC(ZSTD(1)),
    `plan`            Nullable(String) CODEC(ZSTD(3)),
    `ingested_at`     DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree(t_ns)
ORDER BY (job, advice_id)
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'mitigation advice (Greyhound ski-rental planner): one row per decision, advice_id = anomaly/strategy/action [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`whatif`
(
    `job`         LowCardinality(String),
    `step`        Int64 CODEC(Delta, ZSTD(1)),
    `computed_ns` Int64 CODEC(Delta, ZSTD(1)),
    `slowdown`    Nullable(Float64) CODEC(ZSTD(1)),
    `result`      String CODEC(ZSTD(3)),
    `reported_ns` Int64 CODEC(Delta, ZSTD(1)),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree(computed_ns)
ORDER BY (job, step)
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'what-if results (diagnosis.md whatif) of the recent steps of a job [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`diagnoses`
(
    `job`         LowCardinality(String),
    `version`     UInt64 CODEC(Delta, ZSTD(1)),
    `iterations`  String CODEC(ZSTD(3)),
    `anomalies`   UInt32,
    `updated_ns`  Int64 CODEC(Delta, ZSTD(1)),
    `ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (job)
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'per job: the iterations summary of its diagnosis; the latest version wins [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`processor_cuts`
(
    `consumer_group` LowCardinality(String),
    `partition_id`   UInt32,
    `seq`            UInt64 CODEC(Delta, ZSTD(1)),
    `ranges`         String CODEC(ZSTD(3)),
    `created_ns`     Int64 CODEC(Delta, ZSTD(1)),
    `ingested_at`    DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree
ORDER BY (consumer_group, partition_id, seq)
TTL ingested_at + INTERVAL 7 DAY
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'stream processor: input offset ranges of each sink write, logged before it [failslow schema v3]';

CREATE TABLE IF NOT EXISTS `failslow`.`processor_snapshots`
(
    `consumer_group` LowCardinality(String),
    `partition_id`   UInt32,
    `seq`            UInt64 CODEC(Delta, ZSTD(1)),
    `offsets`        String CODEC(ZSTD(3)),
    `state`          String CODEC(ZSTD(3)),
    `created_ns`     Int64 CODEC(Delta, ZSTD(1)),
    `ingested_at`    DateTime DEFAULT now() CODEC(Delta, ZSTD(1))
)
ENGINE = ReplacingMergeTree(created_ns)
ORDER BY (consumer_group, partition_id)
SETTINGS non_replicated_deduplication_window = 10000
COMMENT 'stream processor: detector state of the jobs of a partition and its offsets [failslow schema v3]';
