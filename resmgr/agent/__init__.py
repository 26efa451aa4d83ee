"""cri-resmgr-agent: the node agent that talks to the Kubernetes API (not yet built)."""
