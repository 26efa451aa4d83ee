"""cri-resmgr: node resource manager for Kubernetes (CRI relay, engine, policies)."""

__version__ = "0.2.0"
