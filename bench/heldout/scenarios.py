"""The held-out grid of named jobs."""

from __future__ import annotations

from .model import Fault, Spec


def scenarios() -> dict[str, Spec]:
    """The held-out grid: name -> job (clean runs `c-`, compute stragglers `s-`, slow links
    `l-`, compound faults `x-`, hangs `h1-`/`h2-`/`h3-`)."""
    S, F = Spec, Fault
    return {
        # clean runs
        "c-lognormal": S(seed=1),
        "c-pareto-gc": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            jitter="pareto",
            jitter_scale=0.05,
            gc_prob=0.01,
            seed=2,
        ),
        "c-bursts-bimodal": S(tp=4, pp=2, dp=4, jitter="bimodal", burst_prob=0.03, seed=3),
        "c-skew-drift-parquet": S(
            tp=2, pp=2, dp=8, skew_ms=5.0, drift_ppm=50, missing_t_start=0.5, fmt="parquet", seed=4
        ),
        "c-order-dp-first-rsag": S(order=("dp", "tp", "pp"), dp_mode="rs_ag", seed=5),
        "c-order-pp-mid-pairs": S(
            order=("tp", "pp", "dp"), pp_comm="pair", small_allreduce=True, seed=6
        ),
        "c-128-parquet-gc": S(
            tp=4, pp=4, dp=8, microbatches=8, gc_prob=0.005, fmt="parquet", iterations=30, seed=7
        ),
        "c-meta-unknown-gpn4": S(meta_degrees=False, gpus_per_node=4, comms_in_meta=True, seed=8),
        # compute stragglers
        "s-compute-1.2-last": S(faults=[F("compute", 13, start=14, end=28, factor=1.2)], seed=11),
        "s-compute-1.5-first": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            faults=[F("compute", 5, start=12, factor=1.5)],
            seed=12,
        ),
        "s-compute-2-mid-pareto": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            jitter="pareto",
            jitter_scale=0.05,
            faults=[F("compute", 17, start=15, end=30, factor=2.0)],
            seed=13,
        ),
        "s-compute-3-skew": S(
            tp=2,
            pp=2,
            dp=8,
            skew_ms=5.0,
            drift_ppm=50,
            missing_t_start=1.0,
            faults=[F("compute", 22, start=10, end=20, factor=3.0)],
            seed=14,
        ),
        "s-compute-1.3-order": S(
            order=("dp", "tp", "pp"), faults=[F("compute", 6, start=14, factor=1.3)], seed=15
        ),
        "s-compute-1.5-gc-bursts": S(
            tp=4,
            pp=2,
            dp=4,
            gc_prob=0.01,
            burst_prob=0.02,
            faults=[F("compute", 30, start=14, end=30, factor=1.5)],
            fmt="parquet",
            seed=16,
        ),
        "s-compute-1.4-128": S(
            tp=4,
            pp=4,
            dp=8,
            microbatches=8,
            iterations=30,
            faults=[F("compute", 100, start=12, factor=1.4)],
            fmt="parquet",
            seed=17,
        ),
        "s-compute-2-tp1": S(
            tp=1,
            pp=4,
            dp=4,
            microbatches=8,
            faults=[F("compute", 9, start=14, end=26, factor=2.0)],
            seed=18,
        ),
        # slow links
        "l-pp-3x": S(
            faults=[F("communication", 3, peer=11, start=14, end=28, factor=3.0)],
            pp_bytes=64 << 20,
            seed=21,
        ),
        "l-pp-5x-pairs": S(
            pp_comm="pair",
            faults=[F("communication", 4, peer=12, start=14, factor=5.0)],
            pp_bytes=64 << 20,
            seed=22,
        ),
        "l-dp-ring-4x-linkrows": S(
            tp=2,
            pp=2,
            dp=8,
            link_rows=True,
            faults=[F("communication", 6, peer=8, start=14, end=28, factor=4.0)],
            seed=23,
        ),
        "l-dp-ring-3x-nolink": S(
            tp=2,
            pp=2,
            dp=8,
            faults=[F("communication", 6, peer=8, start=14, end=28, factor=3.0)],
            seed=24,
        ),
        "l-pp-2x-skew-parquet": S(
            skew_ms=4.0,
            missing_t_start=0.3,
            fmt="parquet",
            faults=[F("communication", 1, peer=9, start=14, factor=2.0)],
            pp_bytes=64 << 20,
            seed=25,
        ),
        # hangs
        "h1-tp": S(
            faults=[F("not_entered", 5, start=15, comm="tp", microbatch=2, index=1)], seed=31
        ),
        "h1-pp": S(
            tp=2,
            pp=4,
            dp=4,
            faults=[F("not_entered", 18, start=15, comm="pp", microbatch=1)],
            seed=32,
        ),
        "h1-dp": S(faults=[F("not_entered", 9, start=15, comm="dp")], seed=33),
        "h2-dp-bytes": S(faults=[F("inconsistent", 10, start=15, comm="dp")], seed=34),
        "h2-dp-op-rsag": S(
            dp_mode="rs_ag",
            faults=[F("inconsistent", 2, start=15, comm="dp", mismatch="op")],
            seed=35,
        ),
        "h2-pp-bytes": S(
            faults=[F("inconsistent", 12, start=15, comm="pp", microbatch=2)], seed=36
        ),
        "h3-dp": S(tp=2, pp=2, dp=8, faults=[F("hardware", 6, start=15, comm="dp")], seed=37),
        "h3-dp-linkrows": S(
            tp=2,
            pp=2,
            dp=8,
            link_rows=True,
            faults=[F("hardware", 6, start=15, comm="dp")],
            seed=38,
        ),
        "h3-tp": S(
            tp=4, pp=2, dp=2, faults=[F("hardware", 2, start=15, comm="tp", microbatch=1)], seed=39
        ),
        "l-dp-ring-wrap-3x-nolink": S(
            tp=2,
            pp=2,
            dp=8,
            faults=[F("communication", 14, peer=0, start=14, end=28, factor=3.0)],
            seed=26,
        ),
        "l-dp-ring-wrap-3x-linkrows": S(
            tp=2,
            pp=2,
            dp=8,
            link_rows=True,
            faults=[F("communication", 14, peer=0, start=14, end=28, factor=3.0)],
            seed=27,
        ),
        "x-compound-compute-link": S(
            tp=2,
            pp=2,
            dp=8,
            faults=[
                F("compute", 20, start=12, end=30, factor=1.6),
                F("communication", 3, peer=19, start=12, end=30, factor=3.0),
            ],
            pp_bytes=64 << 20,
            seed=41,
        ),
        "x-two-episodes": S(
            iterations=44,
            faults=[
                F("compute", 2, start=10, end=18, factor=1.6),
                F("compute", 14, start=28, end=38, factor=1.6),
            ],
            seed=42,
        ),
        "s-compute-1.25-pp-first-order": S(
            order=("pp", "tp", "dp"),
            tp=2,
            pp=4,
            dp=2,
            microbatches=8,
            faults=[F("compute", 9, start=14, factor=1.25)],
            seed=43,
        ),
        "s-compute-1.2-128-pareto": S(
            tp=4,
            pp=4,
            dp=8,
            microbatches=8,
            iterations=30,
            jitter="pareto",
            jitter_scale=0.04,
            faults=[F("compute", 77, start=12, factor=1.2)],
            fmt="parquet",
            seed=44,
        ),
        "c-tp-cross-node-skew-drift": S(
            tp=4, pp=2, dp=2, gpus_per_node=2, skew_ms=3.0, drift_ppm=200, seed=51
        ),
        "c-heavy-gc-64": S(
            tp=2, pp=4, dp=8, microbatches=8, gc_prob=0.02, iterations=30, fmt="parquet", seed=52
        ),
        "s-compute-1.5-tp-cross-node-skew": S(
            tp=4,
            pp=2,
            dp=2,
            gpus_per_node=2,
            skew_ms=3.0,
            drift_ppm=200,
            faults=[F("compute", 6, start=14, end=28, factor=1.5)],
            seed=53,
        ),
        "l-tp-cross-node-3x-linkrows": S(
            tp=4,
            pp=2,
            dp=2,
            gpus_per_node=2,
            link_rows=True,
            tp_bytes=32 << 20,
            faults=[F("communication", 1, peer=2, start=14, end=28, factor=3.0)],
            seed=54,
        ),
        "h1-pp-warmup-mb0": S(
            tp=2,
            pp=4,
            dp=2,
            faults=[F("not_entered", 4, start=15, comm="pp", microbatch=0)],
            seed=55,
        ),
        "h2-tp-bytes": S(
            tp=4,
            pp=2,
            dp=2,
            faults=[F("inconsistent", 9, start=15, comm="tp", microbatch=2, index=1)],
            seed=56,
        ),
        "h3-pp-linkrows": S(
            link_rows=True, faults=[F("hardware", 3, start=15, comm="pp", microbatch=1)], seed=57
        ),
        "c-ntp-step-4ms": S(tp=2, pp=2, dp=4, clock_step_ms=4.0, clock_step_s=1.2, seed=61),
        "s-compute-1.15-last": S(
            tp=2, pp=2, dp=4, faults=[F("compute", 12, start=14, end=30, factor=1.15)], seed=62
        ),
        "l-pp-1.3x": S(
            faults=[F("communication", 2, peer=10, start=14, end=30, factor=1.3)],
            pp_bytes=128 << 20,
            seed=63,
        ),
        "x-two-stragglers-same-time": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            faults=[
                F("compute", 3, start=12, end=28, factor=1.5),
                F("compute", 29, start=12, end=28, factor=1.5),
            ],
            seed=64,
        ),
        "s-compute-1.5-ntp-step": S(
            tp=4,
            pp=2,
            dp=2,
            gpus_per_node=2,
            clock_step_ms=-3.0,
            clock_step_s=1.3,
            faults=[F("compute", 2, start=14, end=28, factor=1.5)],
            seed=65,
        ),
        "l-pp-3x-no-tstart": S(
            missing_t_start=1.0,
            faults=[F("communication", 5, peer=13, start=14, end=28, factor=3.0)],
            pp_bytes=64 << 20,
            seed=71,
        ),
        "s-compute-2-early": S(
            iterations=24, faults=[F("compute", 10, start=6, end=16, factor=2.0)], seed=72
        ),
        "l-pp-64": S(
            tp=2,
            pp=4,
            dp=8,
            microbatches=8,
            iterations=30,
            fmt="parquet",
            faults=[F("communication", 20, peer=36, start=12, end=24, factor=3.0)],
            pp_bytes=64 << 20,
            seed=73,
        ),
        "h3-dp-128-linkrows": S(
            tp=4,
            pp=4,
            dp=8,
            microbatches=4,
            iterations=24,
            link_rows=True,
            link_ms=50.0,
            fmt="parquet",
            faults=[F("hardware", 39, start=15, comm="dp")],
            seed=74,
        ),
        "x-slow-then-hang": S(
            faults=[
                F("compute", 5, start=8, factor=1.6),
                F("not_entered", 9, start=24, comm="dp"),
            ],
            seed=75,
        ),
        "c-checkpoint-all-8s": S(pauses=[(20, 8.0, ())], seed=81),
        "c-checkpoint-rank0-8s": S(pauses=[(20, 8.0, (0,))], seed=82),
        "c-long-gc-rank5-3s": S(pauses=[(18, 3.0, (5,))], seed=83),
        "c-checkpoint-rank0-twice": S(
            iterations=44, pauses=[(15, 7.0, (0,)), (35, 7.0, (0,))], seed=84
        ),
        "c-jitter-10pct": S(jitter_scale=0.10, seqlen_sigma=0.08, seed=91),
        "c-bimodal-heavy": S(jitter="bimodal", jitter_scale=0.08, gc_prob=0.02, seed=92),
        "s-compute-1.5-jitter-10pct": S(
            jitter_scale=0.10,
            seqlen_sigma=0.08,
            faults=[F("compute", 3, start=14, end=28, factor=1.5)],
            seed=93,
        ),
        "h1-tp-postmortem": S(
            progress_ms=0,
            post_mortem=True,
            faults=[F("not_entered", 5, start=15, comm="tp", microbatch=2)],
            seed=40,
        ),
    }
