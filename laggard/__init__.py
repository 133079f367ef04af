"""laggard: CLI and pipeline wiring. Stages never import this package."""

__version__ = "0.1.0"
