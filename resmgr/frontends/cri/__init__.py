"""The CRI front end: CRI messages translated to and from the engine's model."""
