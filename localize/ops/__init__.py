"""The operator table the CommOps methods share (`table`), an operator's normal time from its
history (`history`), the detector's features (`features`), group kinds and step judgement."""
