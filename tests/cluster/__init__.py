"""Local Kubernetes control plane + Prometheus harness for e2e tests and `make cluster-up`."""
