"""Who waits for whom: the wait graph, recurrent latecomers, blame ranking, imbalance across peers, hangs."""
