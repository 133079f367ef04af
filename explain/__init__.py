"""explain stage."""
