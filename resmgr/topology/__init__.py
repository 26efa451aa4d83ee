"""Hardware topology: CPUs, packages, dies, cores, NUMA nodes, memory, caches, from sysfs."""
