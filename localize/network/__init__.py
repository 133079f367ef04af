"""Network evidence from CommOps: transfers timed by physics, and slow units resolved to a device."""
