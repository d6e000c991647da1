"""What the integration and end-to-end tests share: the real control plane (one per test session), a namespace
per test, kubectl bound to it, and waiting helpers that return as soon as what they wait for is true."""
