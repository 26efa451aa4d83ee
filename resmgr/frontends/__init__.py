"""Front ends: each translates one protocol to the engine's model calls and back."""
