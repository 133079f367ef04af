"""Bounded, safe handling of user inputs: bounded reads, size caps, user errors, text sanitising, name checks."""
