"""commrt.sim: algorithms' own schedules run in a modelled cluster (see engine.py)."""
from commrt.sim.engine import ScheduleError, Topology, simulate

__all__ = ["ScheduleError", "Topology", "simulate"]
