"""S2 client: micro-batch counts from advice files / a 127.0.0.1 endpoint; weighting."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import numpy as np

from failslow.collectors.mitigation_client import MicrobatchClient, even_split, weight


def _advice(m: list[int], action: str = "apply") -> dict:
    return {"kind": "mitigation_advice", "strategy": "S2", "action": action, "job": "j",
            "advice_id": f"x/S2/{action}", "plan": {"m": m}}


def test_file_apply_revert_and_bad_plans(tmp_path: Path) -> None:
    f = tmp_path / "advice.json"
    c = MicrobatchClient(f, dp_rank=1, dp_size=3, total=10, job="j")
    assert c.microbatches() == 3 and c.m == even_split(10, 3) == [4, 3, 3]
    f.write_text(json.dumps(_advice([6, 1, 3])))
    assert c.microbatches() == 1 and c.advice_id == "x/S2/apply"
    f.write_text(json.dumps(_advice([6, 0, 4])))  # m_i >= 1 violated: ignored, last kept
    assert c.microbatches() == 1 and c.errors == 1
    f.write_text("{partial")
    assert c.microbatches() == 1 and c.errors == 2
    # a JSON Lines log: the last advice wins
    f.write_text(json.dumps(_advice([2, 2, 6])) + "\n" + json.dumps(_advice([], "revert")) + "\n")
    assert c.microbatches() == 3 and c.m == [4, 3, 3]
    f.write_text(json.dumps({**_advice([1, 1, 8]), "job": "other"}))
    assert c.microbatches() == 3


def test_http_endpoint(tmp_path: Path) -> None:
    body = json.dumps(_advice([5, 3])).encode()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        c = MicrobatchClient(f"http://127.0.0.1:{srv.server_port}/advice", dp_rank=0,
                             dp_size=2, total=8)
        assert c.microbatches() == 5
    finally:
        srv.shutdown()
    c2 = MicrobatchClient("http://127.0.0.1:9/none", dp_rank=0, dp_size=2, total=8,
                          timeout_s=0.2)
    assert c2.microbatches() == 4 and c2.errors == 1  # unreachable: even split stays


def test_weighting_keeps_the_global_mean() -> None:
    """sum over groups of (sum of its m_i micro-batch gradients) x weight(M) is the mean
    over all M micro-batches, whatever the split."""
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(8, 5))
    for m in ([4, 4], [6, 2], [7, 1]):
        parts = np.split(grads, np.cumsum(m)[:-1])
        reduced = sum(p.sum(axis=0) * weight(8) for p in parts)
        np.testing.assert_allclose(reduced, grads.mean(axis=0))
