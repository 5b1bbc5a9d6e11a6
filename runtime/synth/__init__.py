"""Synthetic qwen35 models: deterministic GGUF files of the real shapes that behave like trained ones."""
