"""The soak of the production-shaped node (benchmarks/soak.py): load, faults, and a judge that reads the kernel."""
