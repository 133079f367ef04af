"""localize stage: a timeline (and flows, logs) in, a verdict out; docs/design.md maps the sub-packages."""
