from paradec.kv.cache import KVCache

__all__ = ["KVCache"]
