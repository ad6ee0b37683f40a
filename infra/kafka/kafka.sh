#!/usr/bin/env bash
# A one-node Apache Kafka broker (KRaft) on 127.0.0.1 without Docker, from Maven Central's jars
# (infra/kafka/pom.xml). The commands are `failslow infra ...` (cli/infra.py, implemented by
# failslow.infra.kafka_broker in infra/launcher/kafka_broker.py); this runs them:
#
#   bash infra/kafka/kafka.sh up [--port 9092] [--max-lifetime SECONDS] [--state-dir DIR]
#   bash infra/kafka/kafka.sh status [--json]
#   bash infra/kafka/kafka.sh down
#   bash infra/kafka/kafka.sh fetch          # only fetch the jars (~50 MB, cached in ~/.m2)
#
# The broker stops by itself after --max-lifetime (default 12 h).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec failslow infra "$@"
