"""Tests for prexy.cache: policy decisions, keys and the shared store."""
