"""The CRI relay front end: serves CRI on a unix socket and forwards to the runtime."""
