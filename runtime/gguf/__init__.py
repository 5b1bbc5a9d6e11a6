from .reader import GGUFError, GGUFModel, QTensor, load_gguf
from .types import BLOCK, SUPPORTED_TYPES, GGMLType, tensor_nbytes

__all__ = ["GGUFError", "GGUFModel", "QTensor", "load_gguf", "GGMLType", "BLOCK", "SUPPORTED_TYPES", "tensor_nbytes"]
