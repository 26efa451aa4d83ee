"""cri-resmgr: node resource manager for Kubernetes (CRI relay, engine, policies)."""

__version__ = "0.3.0.dev0"
