"""A simulated node: the real engine, policy and CRI front end against models of containerd and
kubelet on a virtual clock, cri-resmgr killed at random moments; seeded and replayable
(`python -m harness.sim`)."""
