"""Settings of the slow-down detector and the constants its parts share: CCL-D §4.2.1
(``T_base``, detection windows, alpha/beta), Greyhound §4.3 (cross-group comparison, link
localization) and the localization shares (module docstring of the package)."""

from __future__ import annotations

from dataclasses import dataclass, field

from failslow import events
from failslow.detectors.changepoints import ChangeConfig

SEND, RECV = events.OP["send"], events.OP["recv"]
KIND_STAGE = {"pp": "pp_p2p", "dp": "dp_sync", "tp": "tp_collective", "cp": "tp_collective"}
SPAN_PASSES = ("forward-compute", "backward-compute")


def pure_dp(meta: events.JobMeta) -> bool:
    """No tensor, pipeline or context parallelism: a pure data-parallel job."""
    return max(meta.tp, meta.pp, meta.cp) <= 1


@dataclass
class SlowdownConfig:
    """Settings of :class:`SlowdownDetector`."""

    # the verification's sign test at 1% (the series alone uses 0.1%): a level becomes an
    # anomaly only once a root persists over its slow iterations beyond chance
    # (Persistence.find), which rejects the bursts of pauses and jitter such a test lets through;
    # values count as slower from 4% on (a 5% slow-down must be found: at a 5% threshold
    # only about half of its iterations would count); an onset of up to 3 slow iterations
    # may be confirmed together with the rank-level evidence (one compute root in each,
    # AnomalyLifecycle.corroborate)
    change: ChangeConfig = field(default_factory=lambda: ChangeConfig(
        alpha=0.01, threshold=0.04, corroborate_after=3))
    # CCL-D §4.2.1
    baseline_rounds: int = 100  # T_base: mean T_max of the first m rounds ...
    baseline_seconds: float = 120.0  # ... m = min(100, rounds in the first two minutes)
    t_base_init_ns: float | None = None  # configured initial T_base (None: learn it)
    ccld_window_s: float = 60.0  # detection window
    ccld_repeat: int = 2  # consecutive slow windows before an alarm
    theta_default: float = 3.0  # CCL-D's practical threshold until the distribution is known
    theta_min: float = 1.0
    theta_k: float = 6.0  # robust deviations above the median of the class's own windows
    theta_windows: int = 5  # windows needed to set theta from the distribution
    alpha: float = 0.4  # CCL-D: P < alpha is communication
    beta: float = 0.6  # CCL-D: P > beta is computation
    # Greyhound §4.3 cross-group comparison and link localization
    transfer_threshold: float = 0.10  # a group's transfer time vs its own baseline
    group_threshold: float = 0.10  # ... and vs the median of its comparable cluster
    noise_z: float = 3.0  # ... and by this many of its own noise (robust sigmas)
    link_threshold: float = 0.30  # a queue pair's in-flight time per work request grew by
    link_min_wrs: int = 64  # MEGATRACE's window: work requests needed in each window
    # localization
    baseline_iterations: int = 8  # the window before the onset used as baseline
    history_iterations: int = 64  # statistics kept (iterations)
    compute_share: float = 0.3  # a rank computes slowly: its extra compute per iteration is
    #                             at least this share of the time lost per iteration ...
    compute_top: float = 0.5  # ... and at least this share of the largest such excess
    max_roots: int = 8  # more ranks than this computing slower is no rank-level fault
    waited_share: float = 0.05  # a compute root is waited on more: >= share x lost time
    explained_share: float = 0.8  # slow groups next to compute roots whose own extra compute
    #                               is this share of the lost time are a side effect
    wait_share: float = 0.3  # wait graph: excess wait >= share x lost time
    comm_share: float = 0.15  # a slow group matters: extra transfer >= share x lost time
    root_asym: float = 0.8  # wait graph: peers wait on a root more than it waits on them
    mixed_share: float = 0.6  # a root on a slow link also computes slowly (wait graph)
    # mixed slow-downs (CCL-D S3): a compute root's own link is slow too
    own_link_ratio: float = 1.5  # a root's own transfers this much slower than their
    #                              reference are its slow link, however little time they cost
    minor_share: float = 0.1  # a rank whose compute grew by this share of the lost time ...
    minor_lead: float = 3.0  # ... and this many times the next rank's growth computes slowly
    #                          too, next to a stronger root or at an end of a slow link that
    #                          took most of the lost time
    localize_retries: int = 12  # iterations to wait for a persistent root before dropping
    min_window_iterations: float = 1.0  # the anomaly window before a localization counts
    consistency: float = 0.6  # share of the slow iterations whose own root must agree
    level_share: float = 0.25  # a persistent stretch starts at an iteration whose excess is
    #                            at least this share of the stretch's median excess (a mild
    #                            noisy one before a far stronger fault is not its start)
    worse_factor: float = 2.0  # a further level whose iterations are this many times as slow
    #                            as the open anomaly's (same root or link) is a new event on
    #                            it, reported on its own
    halves_iterations: int = 3  # without a persistent root after this many slow iterations
    #                            (and every one more), the stretch's halves are judged
    #                            (Persistence.halves; an odd count is halved in time)
    pause_factor: float = 4.0  # ... leaving out a first slow iteration this many times as far
    #                            above the reference as the others' median (a pause that
    #                            opened the level)
    severe_iterations: float = 2.0  # a first slow iteration this many reference iterations
    #                                 long is judged by its two halves (Persistence.within)
    persist_alpha: float = 0.2  # a persistent root's stretch arises by chance (any rank of
    #                             the job, each iteration naming its roots at random) at most
    #                             this often
    refine_iterations: int = 8  # an open anomaly's root may be refined this long
    root_gone: int = 3  # ... and a root no iteration of this many in a row names is dropped
    hidden_iterations: float = 3.0  # an open compute anomaly's window this long is searched
    #                                 for stragglers it hides (hidden_roots)
    bin_shift: int = 22  # initial bin width 2^22 ns (4.2 ms); coarsened to ~1/8 iteration
    #                      (an iteration's own window must span several bins: its edges
    #                      are whole bins, and the compute of a 60 ms iteration seen through
    #                      3-4 bins of 17 ms depends on where the edges fall)
    max_pending_age_s: float = 600.0  # incomplete rounds older than this are dropped
    shards: int = 1  # evidence reducers sharing the job's rows (shards.py; needs meta.comms)
