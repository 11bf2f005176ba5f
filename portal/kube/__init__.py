"""GPU pods on Kubernetes: the binder (scheduler of record) and the deleted-pod sweep."""
