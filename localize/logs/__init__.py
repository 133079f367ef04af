"""Log evidence (L4): failure-indicating lines, the pool of events from successful jobs, iterations."""
