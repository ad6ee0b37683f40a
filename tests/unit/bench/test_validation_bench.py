"""``failslow bench validation`` (issue 17): probes name every slow ring hop the engine's
diagnosis left unpinned (``link: null``), and nothing on a healthy fabric; and the same floors
in the example job (``example_job``: 8 gloo ranks on four emulated nodes, the live engine
asking) where it can run (torch, root)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_validation_names_slow_links_and_no_healthy_one() -> None:
    out = subprocess.run([sys.executable, "-m", "failslow", "bench", "validation", "--json",
                          "--scale", "0.25"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    fig = json.loads(out.stdout)
    assert fig["link_named_without_probe"] == 0
    assert fig["link_named_with_probe"] == fig["slow_link_cases"] == 4
    assert fig["healthy_anomalies"] == 0 and fig["links_named_on_healthy_fabric"] == 0
    assert fig["probes"] == 4 * 4  # one per candidate hop of each unpinned anomaly
    assert 0 < fig["training_lost_s_reported"] <= fig["probe_s_reported"]
    assert fig["iteration_ms_probes_off"] > 0 and fig["iteration_time_ratio"] > 0
    # the example job's floors: tests/integration/native/test_example_engine_probes.py
    assert "scale" in fig["example_job"]["skipped"]
