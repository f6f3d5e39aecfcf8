"""Model and tokenizer construction (transformers classes; no hub access)."""
