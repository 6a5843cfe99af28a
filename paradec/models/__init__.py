from paradec.models.checkpoint import load_model, save_model
from paradec.models.llama import Transformer

__all__ = ["Transformer", "load_model", "save_model"]
