"""The trace contract and its I/O: schemas, the checks every reader applies, validation, meta.json, trace reading and writing, group names."""
