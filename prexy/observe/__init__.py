"""What Prexy observes of its traffic, and the operator's views of it."""
