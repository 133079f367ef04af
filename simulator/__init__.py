"""simulator stage."""
