"""One module per CLI verb; each defines register(subparsers)."""
