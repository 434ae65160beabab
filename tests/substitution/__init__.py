"""Tests for prexy.substitution (pure: no network, no reactor)."""
