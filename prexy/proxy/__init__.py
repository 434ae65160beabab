"""The Twisted side of Prexy: the proxy resource, the upstream client pool and
header handling.  Thin by design: the decisions live in the pure modules."""
