"""Imports of other tools' records: PyTorch Flight Recorder dumps and Kineto (torch.profiler) traces."""
