"""ProPD's dynamic token tree: online acceptance statistics, a latency model, the size choice."""

from paradec.policy.dynamic import Calibration, CurveLatency, LatencyModel, RankStats, TreePolicy

__all__ = ["Calibration", "CurveLatency", "LatencyModel", "RankStats", "TreePolicy"]
