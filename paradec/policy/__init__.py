"""ProPD's dynamic token tree: online acceptance statistics, a latency model, the size choice."""

from paradec.policy.dynamic import Calibration, LatencyModel, RankStats, TreePolicy

__all__ = ["Calibration", "LatencyModel", "RankStats", "TreePolicy"]
