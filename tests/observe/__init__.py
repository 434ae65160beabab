"""Tests of the operator's view (prexy.observe)."""
