"""Test harness: a private containerd, test images, a loopback registry, critest, the demo."""
