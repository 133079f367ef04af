"""The learned detector of abnormal operators, its training, the shipped model and the published baselines."""
