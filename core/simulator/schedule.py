"""Pipeline schedules of the simulator: the shared model of :mod:`failslow.schedule`
(Megatron-LM's non-interleaved 1F1B and GPipe stage programs), re-exported under the name
the simulator's modules and the what-if code import it by."""

from __future__ import annotations

from failslow.schedule import BWD, DPSYNC, FWD, OPT, P2P, P2POp, Step, build_program

__all__ = ["BWD", "DPSYNC", "FWD", "OPT", "P2P", "P2POp", "Step", "build_program"]
