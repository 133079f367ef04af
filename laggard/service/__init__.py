"""`laggard serve`: ingest sidecar summaries, localize continuously, expose metrics and reports."""
