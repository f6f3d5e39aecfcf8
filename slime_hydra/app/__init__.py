"""The composition floor: the only code that reads RunConfig whole and turns names into objects."""
