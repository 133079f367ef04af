"""What touches the cluster, and the guard on it: probe backends, the whitelisted probes, remediation, and the inventory that bounds the names they may use."""
