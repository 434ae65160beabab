"""Unit tier of automatic certificates (prexy.acme)."""
