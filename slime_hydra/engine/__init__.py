"""The thin engine: build components from the typed config, then run the loop."""
