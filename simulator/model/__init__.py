"""Model specs and presets, Hugging Face config import, model families and their operations."""
