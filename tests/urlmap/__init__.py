"""Tests for prexy.urlmap: parser, index, lookups, CLI and scale."""
