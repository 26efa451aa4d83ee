"""Test and demo support: a private containerd with locally built images."""
