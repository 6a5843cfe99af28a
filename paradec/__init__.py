"""paradec: lossless speculative, tree-based and parallel decoding on one small engine."""

from paradec.engine import Engine, Generation, Stats, load

__all__ = ["Engine", "Generation", "Stats", "load"]
__version__ = "0.1.0"
