"""The operator table the CommOps methods share: per-operator features, group kinds, step judgement."""
