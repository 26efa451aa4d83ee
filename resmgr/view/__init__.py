"""What an operator looks at: the state document, the HTTP endpoint serving it with the
Prometheus metrics, and the picture of the node drawn from it."""
