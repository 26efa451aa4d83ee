"""The application layer: the daemon, its command line, status, simulate."""
