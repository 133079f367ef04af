"""localize stage."""
