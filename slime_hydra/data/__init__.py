"""Prompt data: loading slime-format jsonl, generating the embedded tasks, serving groups."""
