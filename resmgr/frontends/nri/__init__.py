"""The NRI front end: the engine as a plugin of the container runtime (containerd, CRI-O)."""
