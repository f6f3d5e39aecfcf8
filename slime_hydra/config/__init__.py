"""Config layer: schemas, ConfigStore registration, composing and checking overrides, checks of the config alone."""
