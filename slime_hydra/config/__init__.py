"""Config layer: schemas, ConfigStore registration, preflight composition and validation."""
